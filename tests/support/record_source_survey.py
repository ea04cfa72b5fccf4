"""Re-record ``replays/source-survey.run.jsonl`` against the local test LLM server.

Run by hand from the repository root: ``python -m tests.support.record_source_survey``.
The server answers by what each request asks (the map's answers arrive in any order),
so the recording is the same whatever order the branches run in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.fake_llm import FakeLlm, RecordedRequest, Reply, last_user_text, text

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Should a small bakery switch to an electric oven?"
ANSWERS = {
    "energy": "An electric deck oven uses about 30-40 kWh on a baking day; at today's "
    "tariffs that costs slightly more than gas but far less than it did in 2022.",
    "quality": "Bakers report crust and oven spring on par with gas deck ovens once the "
    "stone is fully heated; steam injection matters more than the fuel.",
    "cost": "A new three-deck electric oven costs 18,000-30,000 EUR installed, and many "
    "regions subsidise the switch away from gas for small businesses.",
    "grid": "A three-deck oven draws 20-30 kW, which usually needs a three-phase supply "
    "upgrade; ask the grid operator before ordering.",
}


def reply(request: RecordedRequest) -> Reply:
    body = request.body
    system = next(
        (m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"),
        "",
    )
    if "research editor" in system:
        questions = [
            "How much energy does an electric deck oven use compared with gas?",
            "Does an electric oven change bread quality?",
            "What does switching cost, and are there subsidies?",
            "What does the electricity grid connection need?",
        ]
        return text(json.dumps({"questions": questions}), delay=0.05)
    if "careful researcher" in system:
        asked = last_user_text(body).lower()
        key = next(
            (
                k
                for k, w in [("energy", "energy"), ("quality", "quality"), ("cost", "cost")]
                if w in asked
            ),
            "grid",
        )
        return text(ANSWERS[key], delay=0.05)
    return text(
        "Switching is practical: bread quality holds, running costs are close to gas, and "
        "subsidies cover part of the oven, but budget for a three-phase grid upgrade.",
        delay=0.05,
    )


def main() -> int:
    with FakeLlm() as fake, tempfile.TemporaryDirectory() as tmp:
        fake.default = reply
        db = str(Path(tmp) / "events.db")
        env = {
            **os.environ,
            "OPENAI_BASE_URL": fake.url_openai,
            "OPENAI_API_KEY": "test-key",
            "GRAPHRUN_DB": db,
        }
        graphrun = [sys.executable, "-m", "graphrun.cli"]
        done = subprocess.run(
            [*graphrun, "run", "examples/source-survey", PROMPT, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        run_id = json.loads(done.stdout)["run_id"]
        out = ROOT / "replays" / "source-survey.run.jsonl"
        subprocess.run([*graphrun, "export", run_id, "-o", str(out)], cwd=ROOT, env=env, check=True)
        print(f"recorded run {run_id} to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
