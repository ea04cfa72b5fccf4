"""Benchmark graphrun's concurrent super-steps: a ``map`` of LLM calls that each wait 50 ms.

1. Engine concurrency: a ``map`` over N items whose branch is an ``llm`` node answered
   by a local OpenAI-protocol server after 50 ms, at ``max_concurrency: C``, every
   call and result committed to a real SQLite log. Target: <= 1.3x the ideal
   ``N / C * 50 ms`` (0.5 s for 1,000 items at 100).
2. The same calls through LangGraph's ``Send`` fan-out with its async SQLite saver
   (``AsyncSqliteSaver``), measured in the same run: graphrun >= 3x faster.
   LangGraph is optional (``pip install -e '.[bench]'``); without it that comparison
   is skipped, loudly.
3. Replay of the recorded map run through the CLI: >= 20,000 events/s.

A bare asyncio + httpx loop making the same calls is measured in the same run too:
what the machine can do at all, so a loaded machine shows as a slow baseline rather
than as a slow engine.

The server runs in its own process (asyncio, keep-alive), so it shares no GIL with
the engine under test. No process tuning of any kind. Usage:
``python bench/parallel_bench.py [--items N] [--concurrency C] [--json]``; exits 1
when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DELAY = 0.05
IDEAL_RATIO_TARGET = 1.3
LANGGRAPH_TARGET = 3.0
REPLAY_TARGET = 20_000.0

_SERVER = r"""
import asyncio, json, sys

DELAY = float(sys.argv[1])

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            await asyncio.sleep(DELAY)
            prompt = body.get("messages", [{}])[-1].get("content", "")
            out = json.dumps({
                "id": "c", "object": "chat.completion", "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok: " + str(prompt)}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: " + str(len(out)).encode() + b"\r\n\r\n" + out)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


class Server:
    """The 50 ms OpenAI-protocol server, in a child process."""

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(DELAY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


GRAPH = """
name: fan-map
version: "1.0"
model: openai:gpt-bench
start: fan
initial_state:
  items: {items}
nodes:
  fan:
    type: map
    over: "{{{{items}}}}"
    as: item
    branch: call
    collect_into: answers
    max_concurrency: {concurrency}
    next: done
  call:
    type: llm
    prompt: "item {{{{item}}}}"
  done:
    type: end
    output: "{{{{answers[0]}}}}"
"""


def bench_graphrun(url: str, tmp: Path, items: int, concurrency: int) -> tuple[float, Path, str]:
    """Seconds for the map run (log committed), the database and the run id."""
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
    from graphrun.runtime.graph.loader import load_graph

    agent = tmp / "fan-map"
    agent.mkdir()
    (agent / "graph.yaml").write_text(
        GRAPH.format(items=json.dumps(list(range(items))), concurrency=concurrency)
    )
    os.environ["OPENAI_BASE_URL"] = url
    os.environ["OPENAI_API_KEY"] = "bench"
    db = tmp / "graphrun.db"
    store = SqliteStore(db)
    try:
        loaded = load_graph(agent)
        run_id = start_run(store, loaded, prompt="go")
        started = time.perf_counter()
        outcome = drive(Driver(store, run_id, RunOptions(config_dir=tmp / "config")))
        elapsed = time.perf_counter() - started
        if outcome.status != "completed":
            raise SystemExit(f"graphrun run {outcome.status}: {outcome.error}")
    finally:
        store.close()
    return elapsed, db, run_id


def bench_bare(url: str, items: int, concurrency: int) -> float:
    """Seconds for the same calls from a bare asyncio + httpx loop, no engine, no log:
    what this machine can do at all, measured in the same run (the baseline)."""
    import httpx

    async def main() -> float:
        shards = 8
        clients = [
            httpx.AsyncClient(
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=100)
            )
            for _ in range(shards)
        ]
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> str:
            async with gate:
                response = await clients[i % shards].post(
                    f"{url}/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"item {i}"}]},
                    headers={"authorization": "Bearer bench"},
                )
                return str(response.json()["choices"][0]["message"]["content"])

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(items)))
        elapsed = time.perf_counter() - started
        for client in clients:
            await client.aclose()
        return elapsed

    return asyncio.run(main())


def bench_langgraph(url: str, tmp: Path, items: int, concurrency: int) -> float | None:
    """Seconds for the same calls through LangGraph's Send with AsyncSqliteSaver."""
    try:
        import operator
        from typing import Annotated, TypedDict

        import httpx
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send
    except ImportError as exc:
        print(f"SKIPPED LangGraph comparison: {exc} (pip install -e '.[bench]' aiosqlite)")
        return None

    # Functional form: the annotations must be objects, not strings, for LangGraph.
    fields = {"items": list[int], "answers": Annotated[list[str], operator.add]}
    State = TypedDict("State", fields)  # type: ignore[misc]

    async def main() -> float:
        async with httpx.AsyncClient(
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        ) as client:
            # No annotations here: LangGraph reads them, and this module's are strings.
            async def call(item):  # type: ignore[no-untyped-def]
                response = await client.post(
                    f"{url}/chat/completions",
                    json={
                        "model": "gpt-bench",
                        "messages": [{"role": "user", "content": f"item {item['item']}"}],
                    },
                    headers={"authorization": "Bearer bench"},
                    timeout=60,
                )
                text = response.json()["choices"][0]["message"]["content"]
                return {"answers": [text]}

            def fan(state):  # type: ignore[no-untyped-def]
                return [Send("call", {"item": i}) for i in state["items"]]

            builder = StateGraph(State)
            builder.add_node("call", call)
            builder.add_conditional_edges(START, fan, ["call"])
            builder.add_edge("call", END)
            async with AsyncSqliteSaver.from_conn_string(str(tmp / "langgraph.db")) as saver:
                graph = builder.compile(checkpointer=saver)
                started = time.perf_counter()
                result = await graph.ainvoke(
                    {"items": list(range(items)), "answers": []},
                    {"configurable": {"thread_id": "1"}, "max_concurrency": concurrency},
                )
                elapsed = time.perf_counter() - started
                assert len(result["answers"]) == items
                return elapsed

    return asyncio.run(main())


def bench_replay(db: Path, run_id: str) -> tuple[float, int]:
    """Events per second of ``graphrun replay`` through the CLI (process start excluded
    by timing a second, no-op command and subtracting it)."""
    env = {**os.environ, "GRAPHRUN_DB": str(db)}
    cmd = [sys.executable, "-m", "graphrun.cli"]
    out = subprocess.run(
        [*cmd, "events", run_id, "--json"], env=env, capture_output=True, text=True, check=True
    )
    events = len(out.stdout.splitlines())
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([*cmd, "replay", run_id], env=env, capture_output=True, check=True)
        replay = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run([*cmd, "runs", "--json"], env=env, capture_output=True, check=True)
        baseline = time.perf_counter() - started
        best = min(best, max(replay - baseline, 1e-6))
    return events / best, events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ideal = args.items / args.concurrency * DELAY
    report: dict[str, Any] = {"items": args.items, "concurrency": args.concurrency}
    failed = False
    with Server() as url, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bare = min(bench_bare(url, args.items, args.concurrency) for _ in range(2))
        seconds, db, run_id = bench_graphrun(url, tmp, args.items, args.concurrency)
        report["bare_httpx_s"] = round(bare, 3)
        report["ratio_to_bare"] = round(seconds / bare, 2)
        report["graphrun_s"] = round(seconds, 3)
        report["ideal_s"] = round(ideal, 3)
        report["ratio_to_ideal"] = round(seconds / ideal, 2)
        if seconds / ideal > IDEAL_RATIO_TARGET:
            failed = True
        lg = bench_langgraph(url, tmp, args.items, args.concurrency)
        if lg is not None:
            report["langgraph_s"] = round(lg, 3)
            report["speedup_vs_langgraph"] = round(lg / seconds, 2)
            if lg / seconds < LANGGRAPH_TARGET:
                failed = True
        rate, events = bench_replay(db, run_id)
        report["replay_events"] = events
        report["replay_events_per_s"] = round(rate)
        if rate < REPLAY_TARGET:
            failed = True
    if args.json:
        print(json.dumps(report))
    else:
        lg_s = report.get("langgraph_s", float("nan"))
        lines = [
            f"map of {args.items} llm calls (50 ms each) at concurrency {args.concurrency}:",
            f"  bare httpx {report['bare_httpx_s']:.3f} s (asyncio, no engine, no log)",
            f"  graphrun   {report['graphrun_s']:.3f} s = {report['ratio_to_ideal']}x the "
            f"ideal {ideal:.2f} s (target <= {IDEAL_RATIO_TARGET}x), "
            f"{report['ratio_to_bare']}x the bare loop",
            f"  langgraph  {lg_s:.3f} s (Send + AsyncSqliteSaver): graphrun "
            f"{report.get('speedup_vs_langgraph', '?')}x faster (target >= {LANGGRAPH_TARGET}x)",
            f"  replay     {report['replay_events_per_s']} events/s over {events} events "
            f"(target >= {REPLAY_TARGET:.0f})",
        ]
        print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
