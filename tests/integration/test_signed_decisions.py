"""Signed human decisions: real OpenSSH keys (ed25519, ecdsa, rsa), a real ssh-agent,
approver policies read from the governing graph, and ``audit --verify`` on the
database and on an export file alone, against every forgery a writer of the
database or of the file can make (answers edited, moved, replayed, deleted, cut)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphrun.eventstore import codec
from graphrun.eventstore.store import SqliteStore
from tests.support.ssh import Key, make_key, ssh_agent, write_signers  # noqa: F401

SIGNED = """\
name: pub
version: "1.0"
start: publish
settings:
  signed_decisions: required
nodes:
  publish:
    type: approval
    question: "Publish {{initial_prompt}}?"
    options: [approve, reject]
    routes: {approve: done, reject: held}
    on_other: held
    approvers: [alice]
    state_updates:
      choice: "{{choice}}"
  done:
    type: end
    output: "published {{initial_prompt}}"
  held:
    type: end
    output: "held {{initial_prompt}}"
"""

QUORUM = """\
name: quorum
version: "1.0"
start: publish
nodes:
  publish:
    type: approval
    question: "Publish {{initial_prompt}}?"
    options: [approve, reject]
    routes: {approve: done, reject: done}
    on_other: done
    approvals: {required: 2, of: [alice, bob, carol]}
    state_updates:
      choice: "{{choice}}"
  done:
    type: end
    output: "{{choice}}"
"""

CHAIN = """\
name: chain
version: "1.0"
start: first
settings:
  signed_decisions: required
nodes:
  first:
    type: approval
    question: "First?"
    options: [go]
    routes: {go: second}
    on_other: done
    approvers: [alice, bob]
  second:
    type: approval
    question: "Second?"
    options: [go]
    routes: {go: third}
    on_other: done
    approvers: [alice, bob]
  third:
    type: input
    question: "Why?"
    next: done
    state_updates:
      why: "{{input}}"
  done:
    type: end
    output: "done {{why}}"
"""

GATE = """\
name: gate
version: "1.0"
start: review
settings:
  cancel_by: approvers
nodes:
  review:
    type: approval
    question: "Ship {{initial_prompt}}?"
    options: [approve, reject]
    routes: {approve: shipped, reject: held}
    on_other: held
    approvers: [alice, bob]
  shipped:
    type: end
    output: "shipped {{initial_prompt}}"
  held:
    type: end
    output: "held {{initial_prompt}}"
"""


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Key]:
    folder = tmp_path / "keys"
    return {
        "alice": make_key(folder, "alice", "ed25519"),
        "bob": make_key(folder, "bob", "ecdsa"),
        "carol": make_key(folder, "carol", "rsa"),
        "mallory": make_key(folder, "mallory", "ed25519"),
        "host": make_key(folder, "graphrun-host", "ed25519"),
    }


def agent_with_signers(agent: Any, graph: str, keys: dict[str, Key], name: str) -> Path:
    folder = agent(graph, name=name)
    write_signers(
        folder / "allowed_signers", keys["alice"], keys["bob"], keys["carol"], keys["host"]
    )
    return folder


def waiting_run(graphrun: Any, folder: Path, prompt: str = "v1", **env: str) -> str:
    res = graphrun("run", str(folder), prompt, **env)
    assert res.code == 3, res.stderr
    return graphrun.last_run()


def rows(db: Path, run_id: str) -> list[tuple[int, bytes, str]]:
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT id, CAST(body AS BLOB), hash FROM events WHERE run_id = ? ORDER BY id",
            (run_id,),
        ).fetchall()
    conn.close()
    return [(k, bytes(b), h) for k, b, h in found]


def events_of(db: Path, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(body) for _k, body, _h in rows(db, run_id)]


def forge(
    db: Path, run_id: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> None:
    """Rewrite a run's log as someone with write access to the database (and its
    folder) would: edit the events, renumber them, recompute every hash, rebuild the
    runs table, and drop the run from the reported-heads record beside the file."""
    record = Path(f"{db}-reported-heads")
    if record.exists():
        kept = [ln for ln in record.read_text().splitlines(True) if not ln.startswith(run_id)]
        record.write_text("".join(kept))
    before = rows(db, run_id)
    run_no = before[0][0] >> 32
    events = edit([json.loads(body) for _k, body, _h in before])
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM events WHERE run_id = ?", (run_id,))
        prev = codec.GENESIS
        for seq, event in enumerate(events, 1):
            event["seq"] = seq
            body = codec.encode(codec.decode(json.dumps(event)))
            prev = codec.chain_hash(prev, body)
            conn.execute(
                "INSERT INTO events (id, body, hash) VALUES (?, CAST(? AS TEXT), ?)",
                ((run_no << 32) | seq, body, prev),
            )
    conn.close()
    with SqliteStore(db) as store:
        store.rebuild_runs()
        assert store.verify(run_id) is None  # the chain itself verifies


def index(events: list[dict[str, Any]], type_: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == type_][nth]


def audit(graphrun: Any, *args: str, **env: str) -> Any:
    return graphrun("audit", *args, "--verify", timeout=60, **env)


def unchanged(graphrun: Any, run_id: str, before: list[Any], res: Any, *needles: str) -> None:
    """A refusal: exit 2, one line naming the problem, nothing appended."""
    assert res.code == 2, (res.stdout, res.stderr)
    line = res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    for needle in needles:
        assert needle in line, line
    assert rows(graphrun.db, run_id) == before


# -- the policy: signed with the approver's key, nothing else ------------------------


def test_required_signature_refuses_the_wrong_key_no_key_and_a_bare_claim(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    folder = agent_with_signers(agent, SIGNED, keys, "pub")
    started = graphrun("run", str(folder), "v1")
    assert started.code == 3
    run_id = graphrun.last_run()
    assert f"answer with: graphrun approve {run_id} <approve|reject> --sign <key>" in (
        started.stderr
    )
    before = rows(graphrun.db, run_id)
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["bob"].path))
    unchanged(graphrun, run_id, before, res, "'bob' may not answer approval node 'publish'")
    res = graphrun("approve", run_id, "approve", "--as", "alice")
    unchanged(graphrun, run_id, before, res, "node 'publish' requires a signed answer")
    res = graphrun("approve", run_id, "approve")
    unchanged(graphrun, run_id, before, res, "needs --as USER (a claim) or --sign KEY")
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["bob"].path), "--as", "alice")
    unchanged(graphrun, run_id, before, res, "lists this key for bob, not for them")
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["mallory"].path))
    unchanged(graphrun, run_id, before, res, "the key is not listed in")
    res = graphrun("run", str(folder), "v2", "--answer", "publish=approve", "--as", "alice")
    assert res.code == 2 and "requires a signed answer" in res.stderr, res.stderr
    # alice's own key: the run completes, and the answer is verified by her key.
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["alice"].path))
    assert res.code == 0, res.stderr
    assert "published v1" in res.stdout
    received = [e for e in events_of(graphrun.db, run_id) if e["type"] == "HumanInputReceived"]
    (answer,) = received
    assert (answer["by"], answer["identity"], answer["signature_kind"]) == (
        "alice",
        "verified",
        "sshsig",
    )
    statement = json.loads(answer["statement"])
    assert statement["domain"] == "graphrun-decision@v1"
    assert statement["run_id"] == run_id and statement["answer"] == "approve"
    assert statement["asked_head"] == rows(graphrun.db, run_id)[statement["asked_seq"] - 1][2]
    res = audit(graphrun, run_id)
    assert res.code == 0, res.stderr
    assert f"verified: run {run_id} seq {answer['seq']} node 'publish' visit 1" in res.stderr
    assert answer["key"] in res.stderr and answer["key"].startswith("SHA256:")
    table = graphrun("audit", run_id).stdout.splitlines()
    assert "IDENTITY" in table[0] and " signed " in table[1]


def test_signing_through_a_real_ssh_agent(
    graphrun: Any,
    agent: Any,
    keys: dict[str, Key],
    ssh_agent: Any,  # noqa: F811
) -> None:
    folder = agent_with_signers(agent, SIGNED, keys, "pub")
    run_id = waiting_run(graphrun, folder)
    ssh_agent.add(keys["alice"])
    # Only the public key on the command line: the private key is in the agent
    # (and nowhere else any more).
    keys["alice"].path.rename(keys["alice"].path.with_name("moved-away"))
    res = graphrun("approve", run_id, "1", "--sign", str(keys["alice"].pub), SSH_AUTH_SOCK="")
    assert res.code == 2 and "could not sign" in res.stderr, res.stderr
    res = graphrun(
        "approve", run_id, "1", "--sign", str(keys["alice"].pub), SSH_AUTH_SOCK=ssh_agent.sock
    )
    assert res.code == 0, res.stderr
    assert "signed by alice (SHA256:" in res.stderr
    # Verification needs no agent.
    res = audit(graphrun, run_id, SSH_AUTH_SOCK="")
    assert res.code == 0 and "verified:" in res.stderr, res.stderr


def test_an_input_answer_and_a_free_form_answer_are_signed_too(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    folder = agent_with_signers(agent, CHAIN, keys, "chain")
    run_id = waiting_run(graphrun, folder)
    for _ in range(2):
        res = graphrun("approve", run_id, "go", "--sign", str(keys["bob"].path))
        assert res.code in (0, 3), res.stderr
    res = graphrun("answer", run_id, "because", "--as", "bob")
    assert res.code == 2 and "requires a signed answer" in res.stderr
    res = graphrun("answer", run_id, "because", "--sign", str(keys["carol"].path))
    assert res.code == 0, res.stderr
    assert "done because" in res.stdout
    res = audit(graphrun, run_id)
    assert res.code == 0, res.stderr
    assert res.stderr.count("verified: ") == 3


# -- several signers ------------------------------------------------------------------


def test_two_of_three_waits_for_a_second_distinct_signer(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    folder = agent_with_signers(agent, QUORUM, keys, "quorum")
    run_id = waiting_run(graphrun, folder)
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["alice"].path), "--json")
    assert res.code == 0, res.stderr
    assert "the run waits for more signatures" in res.stderr
    assert json.loads(res.stdout)["status"] == "waiting"
    assert graphrun("runs", "--json").json_lines()[0]["status"] == "waiting"
    before = rows(graphrun.db, run_id)
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["alice"].path))
    unchanged(graphrun, run_id, before, res, "'alice' already signed node 'publish'", "counts once")
    res = graphrun("approve", run_id, "approve", "--as", "bob")
    unchanged(graphrun, run_id, before, res, "requires a signed answer")
    res = graphrun("approve", run_id, "approve", "--sign", str(keys["carol"].path))
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == "approve"
    types = [e["type"] for e in events_of(graphrun.db, run_id)]
    assert types.count("ApprovalSigned") == 1 and types.count("HumanInputReceived") == 1
    res = audit(graphrun, run_id)
    assert res.code == 0, res.stderr
    assert "(co-signature) (key SHA256:" in res.stderr
    # Deleting the first signature (and re-hashing) is named: the second lists it.
    forge(graphrun.db, run_id, lambda ev: [e for e in ev if e["type"] != "ApprovalSigned"])
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "a deleted approval" in res.stderr or "needs 2 distinct signers" in res.stderr


# -- forgeries in the database ------------------------------------------------------------


def completed_chain(graphrun: Any, agent: Any, keys: dict[str, Key], prompt: str = "v1") -> str:
    folder = agent_with_signers(agent, CHAIN, keys, "chain")
    run_id = waiting_run(graphrun, folder, prompt)
    assert graphrun("approve", run_id, "go", "--sign", str(keys["alice"].path)).code == 3
    assert graphrun("approve", run_id, "go", "--sign", str(keys["bob"].path)).code == 3
    res = graphrun("answer", run_id, "ok", "--sign", str(keys["alice"].path))
    assert res.code == 0, res.stderr
    return run_id


def test_an_edited_answer_with_a_recomputed_chain_is_named(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    run_id = completed_chain(graphrun, agent, keys)

    def edit(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events[index(events, "HumanInputReceived", 2)]["answer"] = "forged"
        return events

    forge(graphrun.db, run_id, edit)
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "edited answer: the log says 'forged', the signer answered 'ok'" in res.stderr


def test_a_signed_answer_moved_to_another_run_is_named(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    first = completed_chain(graphrun, agent, keys, "a")
    second = completed_chain(graphrun, agent, keys, "b")
    donor = events_of(graphrun.db, first)[
        index(events_of(graphrun.db, first), "HumanInputReceived")
    ]

    def move(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        at = index(events, "HumanInputReceived")
        for field in ("statement", "signature", "key", "answer"):
            events[at][field] = donor[field]
        return events

    forge(graphrun.db, second, move)
    res = audit(graphrun, second)
    assert res.code == 1
    assert f"moved: the signed statement is for run {first}" in res.stderr


def test_a_replayed_signature_of_another_visit_or_node_is_named(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    run_id = completed_chain(graphrun, agent, keys)

    def replay(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        old = events[index(events, "HumanInputReceived", 0)]
        new = events[index(events, "HumanInputReceived", 1)]
        for field in ("statement", "signature", "key", "by"):
            new[field] = old[field]
        return events

    forge(graphrun.db, run_id, replay)
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "moved: the signed statement is for node 'first'" in res.stderr


def test_a_deleted_approval_between_two_signed_ones_is_named(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    run_id = completed_chain(graphrun, agent, keys)

    def delete(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The second approval's request, answer and step go; the chain is recomputed.
        gone = {"second"}
        return [
            e
            for e in events
            if not (e.get("node_id") in gone and e["type"] != "NodeEntered")
            and not (e["type"] == "NodeEntered" and e.get("node_id") in gone)
        ]

    forge(graphrun.db, run_id, delete)
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "node 'third' visit 1" in res.stderr
    assert "is not the one the signer saw" in res.stderr


def test_a_cut_tail_is_named_by_the_signed_heads(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    env = {"GRAPHRUN_HEAD_KEY": str(keys["host"].path), "GRAPHRUN_HEAD_PRINCIPAL": "graphrun-host"}
    folder = agent_with_signers(agent, CHAIN, keys, "chain")
    run_id = waiting_run(graphrun, folder, **env)
    for who in ("alice", "bob"):
        graphrun("approve", run_id, "go", "--sign", str(keys[who].path), **env)
    res = graphrun("answer", run_id, "ok", "--sign", str(keys["alice"].path), **env)
    assert res.code == 0, res.stderr
    types = [e["type"] for e in events_of(graphrun.db, run_id)]
    assert types[-1] == "HeadSigned" and types.count("HeadSigned") == 4
    res = audit(graphrun, run_id)
    assert res.code == 0, res.stderr
    assert f"ok: run {run_id}: 4 signed head(s)" in res.stderr
    # A replay keeps its scratch log to itself; a fork's copied heads stay its source's.
    assert graphrun("replay", run_id, **env).code == 0
    at = index(events_of(graphrun.db, run_id), "HumanInputReceived", 1) + 3
    assert graphrun("fork", run_id, "--at", str(at), **env).code == 3
    fork = graphrun.last_run()
    res = audit(graphrun, fork)
    assert res.code == 0, res.stderr
    assert f"ok: run {fork}: " in res.stderr
    # Cut the last events (with the runs table made to agree) and the tail is named.
    forge(graphrun.db, run_id, lambda ev: ev[:-4])
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "without a signed head: its tail was cut or appended to" in res.stderr
    # Recompute the chain after an edit before the heads: they no longer match.
    run2 = waiting_run(graphrun, folder, "v2", **env)
    graphrun("approve", run2, "go", "--sign", str(keys["alice"].path), **env)

    def edit(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events[0]["initial_prompt"] = "v3"
        return events

    forge(graphrun.db, run2, edit)
    res = audit(graphrun, run2)
    assert res.code == 1
    assert "is not the one signed" in res.stderr


# -- an export verifies on its own ---------------------------------------------------------


def rewrite_export(
    path: Path, out: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> Path:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    header, events = lines[0], [r["event"] for r in lines[1:] if "event" in r]
    events = edit(events)
    text = [json.dumps(header)]
    prev: dict[str, str] = {}
    heads: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for event in events:
        rid = event["run_id"]
        counts[rid] = counts.get(rid, 0) + 1
        event["seq"] = counts[rid]
        body = codec.encode(codec.decode(json.dumps(event)))
        prev[rid] = codec.chain_hash(prev.get(rid, codec.GENESIS), body)
        heads[rid] = {"events": counts[rid], "head": prev[rid]}
        text.append(f'{{"hash":"{prev[rid]}","event":{body.decode()}}}')
    text.append(json.dumps({"trailer": {"runs": heads}}))
    out.write_text("\n".join(text) + "\n", encoding="utf-8")
    return out


def test_an_export_verifies_without_the_database_and_names_each_forgery(
    graphrun: Any, agent: Any, keys: dict[str, Key], tmp_path: Path
) -> None:
    run_id = completed_chain(graphrun, agent, keys)
    out = tmp_path / "signed.run.jsonl"
    res = graphrun("export", run_id, "-o", str(out))
    assert res.code == 0 and "exported exactly as stored" in res.stderr, res.stderr
    signers = tmp_path / "chain" / "allowed_signers"
    nodb = {"GRAPHRUN_DB": str(tmp_path / "absent" / "none.db")}
    res = graphrun("audit", str(out), "--verify", "--signers", str(signers), **nodb)
    assert res.code == 0, res.stderr
    assert f"{out}: 3 verified" in res.stderr
    assert not (tmp_path / "absent").exists()
    as_json = graphrun("audit", str(out), "--verify", "--signers", str(signers), "--json", **nodb)
    assert as_json.json()["counts"] == {"verified": 3}  # type: ignore[index]

    def edit(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events[index(events, "HumanInputReceived", 2)]["answer"] = "forged"
        return events

    def cut(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        at = index(events, "HumanInputReceived", 1)
        return [e for i, e in enumerate(events) if i != at]

    cases = {
        "edited": (edit, "edited answer: the log says 'forged'"),
        "deleted": (cut, "is not the one the signer saw"),
    }
    for name, (change, needle) in cases.items():
        forged = rewrite_export(out, tmp_path / f"{name}.run.jsonl", change)
        res = graphrun("audit", str(forged), "--verify", "--signers", str(signers), **nodb)
        assert res.code == 1, (name, res.stderr)
        assert needle in res.stderr, (name, res.stderr)
    # An edit without recomputing the hashes is named by the file's own chain.
    raw = out.read_text().replace('"answer":"ok"', '"answer":"no"')
    (tmp_path / "raw.run.jsonl").write_text(raw)
    res = graphrun("audit", str(tmp_path / "raw.run.jsonl"), "--verify", "--signers", str(signers))
    assert res.code == 1 and "does not match its hash" in res.stderr
    # Without a signers file a signature cannot be taken as verified.
    res = graphrun("audit", str(out), "--verify", **nodb)
    assert res.code == 1 and "no allowed_signers file" in res.stderr
    # The export imports into a fresh database and verifies there unchanged.
    fresh = tmp_path / "fresh.db"
    assert graphrun("import", str(out), "--db", str(fresh)).code == 0
    res = graphrun("audit", run_id, "--verify", "--db", str(fresh), "--signers", str(signers))
    assert res.code == 0, res.stderr
    assert res.stderr.count("verified: ") == 3


# -- forged approvals: the governing graph decides, never the recorded question --------------


def test_an_import_with_the_requests_approvers_emptied_is_refused(
    graphrun: Any, agent: Any, tmp_path: Path
) -> None:
    folder = agent(GATE, name="gate")
    run_id = waiting_run(graphrun, folder)
    out = tmp_path / "wait.run.jsonl"
    assert graphrun("export", run_id, "-o", str(out)).code == 0

    def forge_answer(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        request = events[index(events, "HumanInputRequested")]
        request["approvers"] = []
        answer = {
            "type": "HumanInputReceived",
            "run_id": run_id,
            "ts": request["ts"] + 1,
            "node_id": "review",
            "visit": request["visit"],
            "answer": "approve",
            "by": "mallory",
            "channel": "approve",
            "question": request["question"],
            "options": request["options"],
        }
        return [*events, answer]

    forged = rewrite_export(out, tmp_path / "forged.run.jsonl", forge_answer)
    fresh = tmp_path / "fresh.db"
    res = graphrun("import", str(forged), "--db", str(fresh), "--agent-dir", str(folder))
    assert res.code == 2, res.stderr
    assert "an answer by 'mallory' at node 'review', whose approvers are alice, bob" in res.stderr
    assert not fresh.exists() or graphrun("runs", "--json", "--db", str(fresh)).stdout == ""


def test_a_forged_approval_in_the_database_is_refused_by_resume_and_named_by_audit(
    graphrun: Any, agent: Any
) -> None:
    folder = agent(GATE, name="gate")
    run_id = waiting_run(graphrun, folder)

    def forge_answer(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        request = events[index(events, "HumanInputRequested")]
        request["approvers"] = []
        answer = {
            "type": "HumanInputReceived",
            "run_id": run_id,
            "ts": request["ts"] + 1,
            "node_id": "review",
            "visit": request["visit"],
            "answer": "approve",
            "by": "mallory",
            "channel": "approve",
        }
        return [*events, answer]

    forge(graphrun.db, run_id, forge_answer)
    before = rows(graphrun.db, run_id)
    res = graphrun("resume", run_id)
    unchanged(graphrun, run_id, before, res, "recorded answer by 'mallory'", "nothing was appended")
    res = audit(graphrun, run_id)
    assert res.code == 1
    assert "'mallory' is not an approver of node 'review' in the run's graph" in res.stderr


def test_a_recorded_graph_that_disagrees_with_the_one_on_disk_is_refused(
    graphrun: Any, agent: Any
) -> None:
    folder = agent(GATE, name="gate")
    run_id = waiting_run(graphrun, folder)

    def widen(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        source = events[0]["graph_source"].replace(
            "approvers: [alice, bob]", "approvers: [mallory]"
        )
        events[0]["graph_source"] = source
        events[0]["graph_hash"] = codec.content_hash(source)
        events[index(events, "HumanInputRequested")]["approvers"] = ["mallory"]
        return events

    forge(graphrun.db, run_id, widen)
    before = rows(graphrun.db, run_id)
    res = graphrun("approve", run_id, "approve", "--as", "mallory")
    unchanged(graphrun, run_id, before, res, "differs between the run's recorded graph", "gate")


def test_a_padded_name_is_refused_not_trimmed(graphrun: Any, agent: Any) -> None:
    folder = agent(GATE, name="gate")
    run_id = waiting_run(graphrun, folder)
    before = rows(graphrun.db, run_id)
    res = graphrun("approve", run_id, "approve", "--as", " alice ")
    unchanged(graphrun, run_id, before, res, "surrounding or control whitespace")
    res = graphrun("approve", run_id, "approve", "--as", "Alice")
    unchanged(graphrun, run_id, before, res, "'Alice' may not answer")


def test_cancel_by_approvers_refuses_anyone_else(graphrun: Any, agent: Any) -> None:
    folder = agent(GATE, name="gate")
    run_id = waiting_run(graphrun, folder)
    before = rows(graphrun.db, run_id)
    for who in (("--as", "mallory"), ("--as", " alice "), ()):
        res = graphrun("cancel", run_id, *who)
        unchanged(graphrun, run_id, before, res, "may not cancel run", "approvers cancel it")
    res = graphrun("cancel", run_id, "--as", "bob")
    assert res.code == 0, res.stderr
    assert graphrun("runs", "--json").json_lines()[0]["status"] == "cancelled"


# -- forks, replay, test ---------------------------------------------------------------------


def test_a_fork_reusing_a_signed_answer_says_so_and_replay_keeps_signatures(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    run_id = completed_chain(graphrun, agent, keys)
    events = events_of(graphrun.db, run_id)
    at = index(events, "HumanInputReceived", 1) + 2
    res = graphrun("fork", run_id, "--at", str(at))
    assert res.code == 3, res.stderr
    assert f"the fork reuses 2 signed answer(s) of run {run_id} (alice, bob)" in res.stderr
    fork = graphrun.last_run()
    res = audit(graphrun, fork)
    assert res.code == 0, res.stderr
    assert f"carried from run {run_id}" in res.stderr
    assert res.stderr.count("verified: ") == 2
    before = rows(graphrun.db, run_id)
    res = graphrun("replay", run_id)
    assert res.code == 0, res.stderr
    assert rows(graphrun.db, run_id) == before
    # A live replay records a new run reusing the recorded answers: their
    # signatures are copied as they are, and reported as the source run's.
    changed = agent_with_signers(
        agent, CHAIN.replace("done {{why}}", "finished {{why}}"), keys, "c2"
    )
    res = graphrun("replay", run_id, "--live", "--graph", str(changed))
    assert res.code == 1 and "reused 3 recorded effect(s), performed 0" in res.stderr
    rerun = next(
        r["run_id"]
        for r in graphrun("runs", "--json").json_lines()
        if r["run_id"] not in (run_id, fork)  # type: ignore[index]
    )
    copied = [e for e in events_of(graphrun.db, rerun) if e["type"] == "HumanInputReceived"]
    original = [e for e in events if e["type"] == "HumanInputReceived"]
    assert [e["signature"] for e in copied] == [e["signature"] for e in original]
    res = audit(graphrun, rerun)
    assert res.code == 0, res.stderr
    assert res.stderr.count(f"carried from run {run_id}") == 3


def test_signed_and_claimed_at_a_glance_in_audit_json_report_and_spans(
    graphrun: Any, agent: Any, keys: dict[str, Key], tmp_path: Path
) -> None:
    signed_run = completed_chain(graphrun, agent, keys)
    claimed_run = waiting_run(graphrun, agent(GATE, name="gate"))
    assert graphrun("approve", claimed_run, "approve", "--as", "bob").code == 0
    listed = graphrun("audit", signed_run, "--json").json()
    assert {d["identity"] for d in listed["decisions"]} == {"signed"}  # type: ignore[index]
    verified = graphrun("audit", signed_run, "--verify", "--json").json()
    assert {d["identity"] for d in verified["decisions"]} == {"verified"}  # type: ignore[index]
    assert verified["signatures"]["counts"] == {"verified": 3}  # type: ignore[index]
    claimed = graphrun("audit", claimed_run, "--verify", "--json").json()
    assert [d["identity"] for d in claimed["decisions"]] == ["claimed"]  # type: ignore[index]
    page = tmp_path / "report.html"
    assert graphrun("report", signed_run, "-o", str(page)).code == 0
    html = page.read_text()
    assert "<th>identity</th>" in html and "signed · SHA256:" in html
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from graphrun.runtime.observe.otel import emit_spans, tracer_provider

    exporter = InMemorySpanExporter()
    provider = tracer_provider(exporter)
    with SqliteStore(graphrun.db) as store:
        emit_spans(store, signed_run, provider.get_tracer("test"))
        emit_spans(store, claimed_run, provider.get_tracer("test"))
    provider.force_flush()
    seen = {
        (s.attributes["graphrun.human.by"], str(s.attributes["graphrun.human.identity"])[:6])
        for s in exporter.get_finished_spans()
        if s.attributes and "graphrun.human.by" in s.attributes
    }
    assert seen == {("alice", "signed"), ("bob", "signed"), ("bob", "claime")}


def test_new_graph_fields_are_validated_with_their_line(graphrun: Any, agent: Any) -> None:
    bad = QUORUM.replace("required: 2, of: [alice, bob, carol]", "required: 3, of: [alice, bob]")
    res = graphrun("validate", str(agent(bad, name="q3")))
    assert res.code == 2
    assert "graph.yaml:11 ($.nodes.publish.approvals.required): approval 'publish': " in res.stderr
    assert "approvals.required is 3, but approvals.of names 2 signer(s)" in res.stderr
    typo = SIGNED.replace("signed_decisions: required", "signed_decisions: always")
    res = graphrun("validate", str(agent(typo, name="typo")))
    assert res.code == 2
    assert "graph.yaml:5" in res.stderr and "signed_decisions" in res.stderr
    schema = graphrun("schema").json()
    node = schema["$defs"]["ApprovalNode"]["properties"]  # type: ignore[index]
    assert {"approvals", "signed_decisions", "approvers"} <= set(node)


def test_an_export_with_signed_heads_names_a_cut_tail_and_a_moved_answer(
    graphrun: Any, agent: Any, keys: dict[str, Key], tmp_path: Path
) -> None:
    env = {"GRAPHRUN_HEAD_KEY": str(keys["host"].path), "GRAPHRUN_HEAD_PRINCIPAL": "graphrun-host"}
    folder = agent_with_signers(agent, SIGNED, keys, "pub")
    runs = []
    for prompt in ("a", "b"):
        run_id = waiting_run(graphrun, folder, prompt, **env)
        res = graphrun("approve", run_id, "approve", "--sign", str(keys["alice"].path), **env)
        assert res.code == 0, res.stderr
        runs.append(run_id)
    files = {}
    for run_id in runs:
        files[run_id] = tmp_path / f"{run_id}.run.jsonl"
        assert graphrun("export", run_id, "-o", str(files[run_id])).code == 0
    signers = str(folder / "allowed_signers")
    nodb = {"GRAPHRUN_DB": str(tmp_path / "absent" / "none.db")}
    first = files[runs[0]]
    res = graphrun("audit", str(first), "--verify", "--signers", signers, **nodb)
    assert res.code == 0, res.stderr
    assert f"ok: run {runs[0]}: 2 signed head(s)" in res.stderr
    # The tail cut and the trailer rewritten: the file still verifies as a chain,
    # but it no longer ends with a signed head.
    cut = rewrite_export(first, tmp_path / "cut.run.jsonl", lambda ev: ev[:-3])
    res = graphrun("audit", str(cut), "--verify", "--signers", signers, **nodb)
    assert res.code == 1
    assert "without a signed head: its tail was cut or appended to" in res.stderr
    # Run b's signed answer moved into run a's file, re-hashed.
    donor = next(
        json.loads(line)["event"]
        for line in files[runs[1]].read_text().splitlines()[1:]
        if '"HumanInputReceived"' in line
    )

    def move(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        at = index(events, "HumanInputReceived")
        for field in ("statement", "signature", "key"):
            events[at][field] = donor[field]
        return [e for e in events if e["type"] != "HeadSigned"]

    moved = rewrite_export(first, tmp_path / "moved.run.jsonl", move)
    res = graphrun("audit", str(moved), "--verify", "--signers", signers, **nodb)
    assert res.code == 1
    assert f"moved: the signed statement is for run {runs[1]}" in res.stderr
    assert not (tmp_path / "absent").exists()


def test_a_token_authenticated_answer_is_recorded_as_such_but_is_no_signature(
    graphrun: Any, agent: Any, keys: dict[str, Key]
) -> None:
    from graphrun.actors.human.actor import AnswerRefused
    from graphrun.runtime.engine.answers import submit_answer

    gate = waiting_run(graphrun, agent(GATE, name="gate"))
    signed = waiting_run(graphrun, agent_with_signers(agent, SIGNED, keys, "pub"))
    with SqliteStore(graphrun.db) as store:
        got = submit_answer(
            store,
            gate,
            "approve",
            kind="approval",
            as_user="alice",
            channel="console",
            identity_class="token",
        )
        store.release_lease(gate)
        assert got.identity == "token"
        with pytest.raises(AnswerRefused, match="requires a signed answer"):
            submit_answer(
                store,
                signed,
                "approve",
                kind="approval",
                as_user="alice",
                channel="console",
                identity_class="token",
            )
    res = graphrun("audit", gate, "--verify", "--json")
    assert [d["identity"] for d in res.json()["decisions"]] == ["token"]  # type: ignore[index]
