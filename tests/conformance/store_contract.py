"""The contract every event store keeps, as a test class to subclass.

Every store raises the same errors for the same situations (the in-memory store
exactly what SQLite raises), so code tested against one behaves the same on another.

A store test module subclasses :class:`StoreContract` and provides ``open_store``
(a new store on the same storage each call, as a second process would open it),
``tamper`` (change one stored body without rehashing) and ``set_lease_pid``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from graphrun.eventstore import codec
from graphrun.eventstore.errors import (
    BrokenLogError,
    ConcurrentAppendError,
    CorruptStoreError,
    LeaseHeldError,
    UnknownRunError,
)
from graphrun.eventstore.events import (
    HumanInputReceived,
    HumanInputRequested,
    NodeCompleted,
    NodeEntered,
    RunCompleted,
    RunFailed,
    RunStarted,
    ScriptFinished,
)
from graphrun.eventstore.ids import Clock


class FakeClock(Clock):
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t


def started(name: str = "g", parent: str | None = None) -> RunStarted:
    return RunStarted(
        graph_name=name,
        graph_source="name: g\n",
        graph_hash=codec.content_hash("name: g\n"),
        initial_state={"n": 0},
        parent_run_id=parent,
        started_by="ann",
    )


def step(node: str, visit: int, n: int, to: str | None) -> list[Any]:
    return [
        NodeEntered(node_id=node, node_type="script", visit=visit),
        ScriptFinished(node_id=node, visit=visit, script="s.py", exit_code=0, output={"n": n}),
        NodeCompleted(node_id=node, visit=visit, routed_to=to, merge_effect=True),
    ]


class StoreContract:
    """Tests every store must pass."""

    def open_store(self, clock: Clock | None = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def tamper(self, store: Any, run_id: str, seq: int, body: bytes) -> None:  # pragma: no cover
        raise NotImplementedError

    def set_lease_pid(self, store: Any, run_id: str, pid: int) -> None:  # pragma: no cover
        raise NotImplementedError

    # -- appending and reading ------------------------------------------------------

    def test_append_stamps_run_id_seq_and_ts(self) -> None:
        store = self.open_store(FakeClock(500.0))
        out = store.append("r1", [started(), *step("a", 1, 1, "b")])
        assert [e.seq for e in out] == [1, 2, 3, 4]
        assert {e.run_id for e in out} == {"r1"}
        assert {e.ts for e in out} == {500.0}
        more = store.append("r1", step("b", 1, 2, None))
        assert [e.seq for e in more] == [5, 6, 7]
        assert store.read("r1") == out + more

    def test_recorded_ts_is_kept(self) -> None:
        store = self.open_store(FakeClock(500.0))
        (event,) = store.append(
            "r1", [codec.from_builtins({**codec.to_builtins(started()), "ts": 7.5})]
        )
        assert event.ts == 7.5
        assert store.read("r1")[0].ts == 7.5

    def test_read_ranges(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, "a"), *step("a", 2, 2, None)])
        assert [e.seq for e in store.read("r1", after=2)] == [3, 4, 5, 6, 7]
        assert [e.seq for e in store.read("r1", upto=3)] == [1, 2, 3]
        assert [e.seq for e in store.read("r1", after=2, upto=4)] == [3, 4]

    def test_read_in_pages_gives_the_same_events_a_page_at_a_time(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from graphrun.eventstore import store as store_module

        store = self.open_store()
        store.append("r1", [started(), *(e for v in range(1, 5) for e in step("a", v, v, "a"))])
        whole = store.read("r1")
        assert len(whole) == 13
        for page in (1, 3, 5, 13, 100):
            monkeypatch.setattr(store_module, "PAGE_EVENTS", page)
            assert list(store_module.read_in_pages(store, "r1")) == whole
            assert list(store_module.read_in_pages(store, "r1", upto=7)) == whole[:7]
        reads = 0
        real = store.read

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "read", counted)
        monkeypatch.setattr(store_module, "PAGE_EVENTS", 5)
        assert len(list(store_module.read_in_pages(store, "r1"))) == 13
        assert reads == 3  # 5 + 5 + 3: a page per read, never the whole log at once

    def test_a_light_read_leaves_llm_wire_bodies_undecoded_and_nothing_else(self) -> None:
        import msgspec

        from graphrun.eventstore.events import LlmCalled
        from graphrun.eventstore.store import read_in_pages

        store = self.open_store()
        call = LlmCalled(
            node_id="a",
            visit=1,
            request={"messages": [{"role": "user", "content": "hi"}]},
            response={"choices": [{"message": {"content": "yo"}}]},
            tool_calls=[{"id": "1", "name": "f", "arguments": "{}"}],
            usage={"prompt_tokens": 3},
            text="yo",
        )
        store.append("r1", [started(), *step("a", 1, 1, "a")[:1], call])
        full = store.read("r1")
        reads = {
            "read": store.read("r1", light=True),
            "pages": list(read_in_pages(store, "r1", light=True)),
            "verified": store.read_verified("r1", light=True)[0],
        }
        for how, light in reads.items():
            assert [type(e).__name__ for e in light] == [type(e).__name__ for e in full], how
            assert light[:-1] == full[:-1], how  # only the LLM call is read differently
            got = light[-1]
            assert isinstance(got, LlmCalled), how
            assert (got.text, got.usage, got.seq) == ("yo", {"prompt_tokens": 3}, 3), how
            for name in ("request", "response", "tool_calls"):
                raw = getattr(got, name)
                assert isinstance(raw, msgspec.Raw), (how, name)
                assert msgspec.json.decode(raw) == getattr(full[-1], name), (how, name)
            assert codec.encode(got) == codec.encode(full[-1]), how

    def test_runs_are_independent(self) -> None:
        store = self.open_store()
        store.append("r1", [started("one")])
        store.append("r2", [started("two")])
        store.append("r1", step("a", 1, 1, None))
        assert [e.seq for e in store.read("r2")] == [1]
        assert store.run("r1").last_seq == 4
        assert store.run("r2").graph_name == "two"

    def test_empty_append_is_a_no_op(self) -> None:
        store = self.open_store()
        assert store.append("r1", []) == []
        assert not store.has_run("r1")

    def test_first_event_must_be_run_started(self) -> None:
        store = self.open_store()
        with pytest.raises(ValueError, match="does not start with RunStarted"):
            store.append("r1", step("a", 1, 1, None))
        assert not store.has_run("r1")

    def test_unknown_run(self) -> None:
        store = self.open_store()
        assert not store.has_run("nope")
        for call in (store.read, store.run, store.verify):
            with pytest.raises(UnknownRunError, match="no run 'nope'"):
                call("nope")

    def test_events_round_trip_through_the_store(self) -> None:
        store = self.open_store()
        events = [
            started(),
            NodeEntered(node_id="ask", node_type="input", visit=1),
            HumanInputRequested(node_id="ask", visit=1, kind="input", question="Name? ü"),
            HumanInputReceived(node_id="ask", visit=1, answer="Zoë", by="ann", channel="flag"),
            NodeCompleted(node_id="ask", visit=1, routed_to="end", updates={"x": [1, {"y": None}]}),
            RunCompleted(node_id="end", output="done"),
        ]
        stamped = store.append("r1", events)
        assert store.read("r1") == stamped
        for original, back in zip(events, stamped, strict=True):
            assert codec.to_builtins(back) | {"run_id": "", "seq": 0, "ts": 0.0} == (
                codec.to_builtins(original) | {"run_id": "", "seq": 0, "ts": 0.0}
            )

    # -- the runs projection ---------------------------------------------------------

    def test_runs_row_follows_the_events(self) -> None:
        store = self.open_store()
        store.append("r1", [started("g1"), NodeEntered(node_id="ask", node_type="input", visit=1)])
        row = store.run("r1")
        assert (row.status, row.current_node, row.started_by) == ("running", "ask", "ann")
        store.append(
            "r1", [HumanInputRequested(node_id="ask", visit=1, kind="input", question="?")]
        )
        assert (store.run("r1").status, store.run("r1").waiting_node) == ("waiting", "ask")
        store.append("r1", [HumanInputReceived(node_id="ask", visit=1, answer="a", by="bo")])
        assert (store.run("r1").status, store.run("r1").waiting_node) == ("running", None)
        store.append("r1", [RunCompleted(node_id="end", output="fine")])
        row = store.run("r1")
        assert (row.status, row.output, row.last_seq) == ("completed", "fine", 5)
        assert row.last_hash == list(store.raw_rows("r1"))[-1][3]

    def test_runs_listing_filters(self) -> None:
        clock = FakeClock(100.0)
        store = self.open_store(clock)
        store.append("p", [started("parent")])
        clock.t = 101.0
        store.append("c", [started("child", parent="p"), RunFailed(error="boom")])
        clock.t = 102.0
        store.append("x", [started("other"), RunCompleted(node_id="e", output="")])
        assert [r.run_id for r in store.runs()] == ["x", "c", "p"]
        assert [r.run_id for r in store.runs(status="failed")] == ["c"]
        assert [r.run_id for r in store.runs(parent="p")] == ["c"]
        assert [r.run_id for r in store.runs(limit=1)] == ["x"]
        assert store.run("c").error == "boom"

    def test_runs_are_listed_a_page_at_a_time(self) -> None:
        clock = FakeClock(100.0)
        store = self.open_store(clock)
        for i in range(7):
            clock.t = 100.0 + i // 2  # runs started at the same time: by id, newest first
            store.append(f"r{i}", [started()])
            if i % 3 == 0:
                store.append(f"r{i}", [RunCompleted(node_id="e", output="")])
        newest = ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
        assert [r.run_id for r in store.runs()] == newest
        pages = [[r.run_id for r in store.runs(limit=3, offset=o)] for o in (0, 3, 6, 9)]
        assert pages == [newest[:3], newest[3:6], newest[6:], []]
        done = [r.run_id for r in store.runs(status="completed", limit=2, offset=1)]
        assert done == ["r3", "r0"]
        assert [r.run_id for r in store.runs(status="running", offset=3)] == ["r1"]

    def test_rebuild_runs_gives_the_same_rows(self) -> None:
        clock = FakeClock(100.0)
        store = self.open_store(clock)
        store.append("p", [started("parent"), *step("a", 1, 1, "a")])
        clock.t = 101.0
        store.append("c", [started("child", parent="p")])
        store.append("c", [NodeEntered(node_id="ask", node_type="input", visit=1)])
        store.append("c", [HumanInputRequested(node_id="ask", visit=1, kind="input", question="?")])
        clock.t = 102.0
        store.append("p", [*step("a", 2, 2, None), RunFailed(error="x", node_id="a")])
        store.append("d", [started("done"), RunCompleted(node_id="e", output="out")])
        before = {r.run_id: r for r in store.runs()}
        assert store.rebuild_runs() == 3
        assert {r.run_id: r for r in store.runs()} == before
        # A fresh store on the same storage sees the rebuilt rows, and can extend them.
        other = self.open_store(clock)
        assert {r.run_id: r for r in other.runs()} == before
        other.append("c", [HumanInputReceived(node_id="ask", visit=1, answer="a", by="b")])
        assert other.verify("c") is None

    def test_runs_row_matches_a_fold_of_every_event_whatever_the_batches(self) -> None:
        """Appending folds only head-changing events into the row one by one; the
        row must still be exactly the fold of all events, for every batching."""
        from graphrun.eventstore.projections import apply_run_row

        events: list[Any] = [
            *step("a", 1, 1, "ask"),
            NodeEntered(node_id="ask", node_type="input", visit=1),
            HumanInputRequested(node_id="ask", visit=1, kind="input", question="?"),
            HumanInputReceived(node_id="ask", visit=1, answer="yes", by="ann"),
            NodeCompleted(node_id="ask", visit=1, routed_to="b"),
            *step("b", 1, 2, "c"),
            NodeEntered(node_id="c", node_type="script", visit=1),
            RunFailed(error="boom", node_id="c"),
        ]
        for size in (1, 2, 3, 5, len(events)):
            clock = FakeClock(100.0)
            store = self.open_store(clock)
            run_id = f"r{size}"
            written = store.append(run_id, [started()])
            for at in range(0, len(events), size):
                clock.t += 1.0
                written += store.append(run_id, events[at : at + size])
            row = None
            for event, digest in zip(written, self._hashes(store, run_id), strict=True):
                row = apply_run_row(row, event, digest)
            assert store.run(run_id) == row, size
            assert row is not None and row.current_node == "c" and row.status == "failed"

    def _hashes(self, store: Any, run_id: str) -> list[str]:
        return [digest for _, _, _, digest in store.raw_rows(run_id)]

    # -- the hash chain ------------------------------------------------------------------

    def test_chain_verifies_and_links(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        store.append("r1", [RunCompleted(node_id="e", output="")])
        rows = list(store.raw_rows("r1"))
        assert rows[0][2] == codec.GENESIS
        for (_s, _b, _p, digest), (_s2, _b2, prev, _h) in itertools.pairwise(rows):
            assert prev == digest
        for _seq, body, prev, digest in rows:
            assert digest == codec.chain_hash(prev, body)
        assert store.verify("r1") is None
        # Verified and read in one pass: the same events as read() gives.
        assert store.read_verified("r1") == (store.read("r1"), None)

    def test_tampering_names_the_first_bad_seq(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, "a"), *step("a", 2, 2, None)])
        rows = {seq: body for seq, body, _p, _h in store.raw_rows("r1")}
        self.tamper(store, "r1", 3, rows[3].replace(b'"n":1', b'"n":9'))
        problem = store.verify("r1")
        assert problem is not None
        assert problem.seq == 3
        assert "modified" in problem.reason
        assert store.read_verified("r1")[1] == problem

    # -- concurrency -------------------------------------------------------------------

    def test_a_stale_writer_gets_concurrent_append_error(self) -> None:
        a = self.open_store()
        b = self.open_store()
        a.append("r1", [started()])
        b.append("r1", step("a", 1, 1, None))
        with pytest.raises(ConcurrentAppendError, match="extended by another writer"):
            a.append("r1", [RunCompleted(node_id="e", output="a")])
        # Nothing of the refused append is stored; the log still verifies.
        assert [e.seq for e in a.read("r1")] == [1, 2, 3, 4]
        assert a.verify("r1") is None
        # The refused writer may retry once it has caught up.
        (done,) = a.append("r1", [RunCompleted(node_id="e", output="a")])
        assert done.seq == 5
        assert b.verify("r1") is None

    def test_a_stale_writer_on_the_fast_path(self) -> None:
        """Step-only appends (no change to the run's head) are refused just the same
        when another writer got there first, and store nothing."""
        a = self.open_store()
        b = self.open_store()
        a.append("r1", [started()])
        a.append("r1", step("a", 1, 1, "a"))  # a now knows the run and its tail
        b.append("r1", step("a", 2, 2, "a"))
        with pytest.raises(ConcurrentAppendError, match="extended by another writer"):
            a.append("r1", step("a", 3, 3, None))
        assert [e.seq for e in b.read("r1")] == list(range(1, 8))
        assert b.verify("r1") is None
        assert [e.seq for e in a.append("r1", step("a", 3, 3, None))] == [8, 9, 10]
        assert a.verify("r1") is None

    def test_an_event_stamped_with_a_stale_seq_is_refused(self) -> None:
        store = self.open_store()
        (first,) = store.append("r1", [started()])
        store.append("r1", step("a", 1, 1, None))
        stale = NodeEntered(run_id="r1", seq=2, ts=first.ts, node_id="b", node_type="end", visit=1)
        with pytest.raises(ConcurrentAppendError, match="as its writer thought"):
            store.append("r1", [stale])
        assert store.run("r1").last_seq == 4

    def test_racing_appends_from_threads(self) -> None:
        """Writers on their own stores race for one run: each append lands whole or
        is refused; the log has every accepted step, gap-free, and verifies."""
        import threading

        self.open_store().append("r1", [started()])
        writers, steps = 4, 12
        refused = [0] * writers
        failures: list[BaseException] = []

        def write(n: int) -> None:
            store = self.open_store()
            done = 0
            try:
                while done < steps:
                    try:
                        store.append("r1", step(f"w{n}", done + 1, done, None))
                        done += 1
                    except ConcurrentAppendError:
                        refused[n] += 1
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failures
        store = self.open_store()
        events = store.read("r1")
        assert [e.seq for e in events] == list(range(1, 2 + 3 * writers * steps))
        # Each step's three events are together: appends never interleave.
        for at in range(1, len(events), 3):
            assert len({getattr(e, "node_id", None) for e in events[at : at + 3]}) == 1
        assert store.verify("r1") is None
        assert store.run("r1").last_seq == len(events)

    # -- damage --------------------------------------------------------------------------

    def test_an_undecodable_event_is_named_by_seq(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        self.tamper(store, "r1", 3, b'{"type": "ScriptFinished", "oops"')
        reader = self.open_store()
        with pytest.raises(CorruptStoreError, match=r"event seq 3 .*does not decode"):
            reader.read("r1")
        assert [e.seq for e in reader.read("r1", upto=2)] == [1, 2]
        problem = reader.verify("r1")
        assert problem is not None and problem.seq == 3
        with pytest.raises(BrokenLogError, match="run r1 does not verify at seq 3") as info:
            reader.require_intact("r1")
        assert info.value.seq == 3

    def test_invalid_utf8_is_named_by_seq(self) -> None:
        store = self.open_store()
        store.append("r1", [started(), *step("a", 1, 1, None)])
        body = next(b for s, b, _p, _h in store.raw_rows("r1") if s == 2)
        self.tamper(store, "r1", 2, body.replace(b'"a"', b'"\xff"', 1))
        problem = self.open_store().verify("r1")
        assert problem is not None and problem.seq == 2

    # -- leases -------------------------------------------------------------------------

    def test_one_lease_holder_at_a_time(self) -> None:
        clock = FakeClock()
        a = self.open_store(clock)
        b = self.open_store(clock)
        a.append("r1", [started()])
        a.acquire_lease("r1")
        a.acquire_lease("r1")  # re-entrant for the holder
        assert a.is_live("r1")
        with pytest.raises(LeaseHeldError, match="run r1 is being extended by process"):
            b.acquire_lease("r1")
        a.release_lease("r1")
        assert a.lease("r1") is None
        assert not b.is_live("r1")
        with b.leased("r1"):
            lease = b.lease("r1")
            assert lease is not None and lease.owner == b.owner
            with pytest.raises(LeaseHeldError):
                a.acquire_lease("r1")
        assert b.lease("r1") is None

    def test_an_expired_lease_can_be_taken_over(self) -> None:
        clock = FakeClock()
        a = self.open_store(clock)
        b = self.open_store(clock)
        a.append("r1", [started()])
        a.acquire_lease("r1", seconds=30)
        clock.t += 29
        with pytest.raises(LeaseHeldError):
            b.acquire_lease("r1")
        a.renew_lease("r1", seconds=30)
        clock.t += 29
        with pytest.raises(LeaseHeldError):
            b.acquire_lease("r1")
        clock.t += 2
        assert not b.is_live("r1")
        b.acquire_lease("r1")
        assert b.lease("r1").owner == b.owner  # type: ignore[union-attr]
        # The old holder's release does not drop the new holder's lease.
        a.release_lease("r1")
        assert b.lease("r1").owner == b.owner  # type: ignore[union-attr]

    def test_a_dead_holders_lease_can_be_taken_over(self) -> None:
        import subprocess
        import sys

        proc = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        dead_pid = int(proc.stdout)
        a = self.open_store()
        b = self.open_store()
        a.append("r1", [started()])
        a.acquire_lease("r1")
        self.set_lease_pid(a, "r1", dead_pid)
        assert not b.is_live("r1")
        b.acquire_lease("r1")
        assert b.lease("r1").owner == b.owner  # type: ignore[union-attr]

    def test_a_dead_holders_lease_row_is_released(self) -> None:
        """A killed process leaves its lease row behind: it is released, and a
        live holder's row stays."""
        import subprocess
        import sys

        proc = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        a = self.open_store()
        b = self.open_store()
        c = self.open_store()
        a.append("r1", [started()])
        a.append("r2", [started()])
        a.acquire_lease("r1")
        self.set_lease_pid(a, "r1", int(proc.stdout))
        b.acquire_lease("r2")
        assert c.release_stale_leases() == ["r1"]
        assert c.lease("r1") is None
        assert c.lease("r2").owner == b.owner  # type: ignore[union-attr]
        assert c.release_stale_leases() == []

    def test_a_pid_now_used_by_another_process_does_not_hold_a_lease(self) -> None:
        """The holder is its pid *and* its start time: a live process that got the
        pid later (here: one started after the holder) does not keep the run."""
        import subprocess
        import sys
        import time

        a = self.open_store()
        b = self.open_store()
        a.append("r1", [started()])
        a.acquire_lease("r1")
        time.sleep(0.05)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            self.set_lease_pid(a, "r1", other.pid)
            assert not b.is_live("r1")
            b.acquire_lease("r1")
            assert b.lease("r1").owner == b.owner  # type: ignore[union-attr]
        finally:
            other.kill()
            other.wait()

    def test_appending_renews_the_holders_lease(self) -> None:
        clock = FakeClock()
        a = self.open_store(clock)
        a.append("r1", [started()])
        a.acquire_lease("r1", seconds=30)
        clock.t += 25
        a.append("r1", step("a", 1, 1, None))
        lease = a.lease("r1")
        assert lease is not None and lease.expires_at > clock.t + 25

    # -- cancel requests ----------------------------------------------------------------

    def test_a_cancel_request_is_seen_by_every_store_and_the_first_stands(self) -> None:
        a = self.open_store()
        b = self.open_store()
        a.append("r1", [started()])
        a.append("r2", [started()])
        a.acquire_lease("r1")  # another process drives r1: asking needs no lease
        assert b.cancel_requested("r1") is None
        b.request_cancel("r1", "ops", "no longer needed")
        assert a.cancel_requested("r1") == ("ops", "no longer needed")
        assert b.cancel_requested("r1") == ("ops", "no longer needed")
        b.request_cancel("r1", "bob", "again")
        assert a.cancel_requested("r1") == ("ops", "no longer needed")
        assert a.cancel_requested("r2") is None
        # Not an event: the run's log and its holder are as they were.
        assert [e.seq for e in a.read("r1")] == [1]
        assert a.verify("r1") is None
        assert a.lease("r1").owner == a.owner  # type: ignore[union-attr]
        a.append("r1", step("a", 1, 1, None))
        assert a.run("r1").last_seq == 4

    def test_a_cancel_request_needs_a_run(self) -> None:
        store = self.open_store()
        with pytest.raises(UnknownRunError):
            store.request_cancel("nope", "ops", "why")
        assert store.cancel_requested("nope") is None
