"""Accepting new behaviour: ``graphrun test --update`` re-records divergent runs.

A recorded run that no longer replays against today's graph is run again on it,
in a scratch database holding the file's runs: every effect whose request did not
change is served from the recording (an LLM call, a retrieval, a child agent, a
person's answer to the same question), and only what changed is performed — a
changed script runs offline, a changed LLM request is the only thing that needs a
model (and its key). The new run then replaces the old one in the export file; a
child agent's run served from the recording goes with it, as the new run's child.

Nothing is written when the new run cannot be completed as the old one was (a
question nobody answered yet, a failed LLM call): the file stays as it is and the
reason is reported.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from graphrun.eventstore.events import ChildRunStarted, LlmResult, RunStarted
from graphrun.eventstore.fold import fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import GraphrunError
from graphrun.runtime.replay.sources import slot_of


@dataclass
class Update:
    """What ``--update`` did (or would do) to one export file."""

    file: Path
    run_id: str
    new_run_id: str | None = None
    reused: list[str] = field(default_factory=list)
    performed: list[str] = field(default_factory=list)
    error: str | None = None
    written: bool = False
    notes: list[str] = field(default_factory=list)

    def line(self, dry_run: bool) -> str:
        if self.error:
            return f"NOT UPDATED {self.file}: run {self.run_id}: {self.error}"
        done = ", ".join(self.performed) or "nothing"
        if dry_run:
            return f"WOULD UPDATE {self.file}: run {self.run_id} would be re-recorded"
        notes = "".join(f"\n  {note}" for note in self.notes)
        return (
            f"UPDATED {self.file}: run {self.run_id} re-recorded as {self.new_run_id}; "
            f"reused {len(self.reused)} recorded effect(s), performed {done}{notes}"
        )


def update_file(
    file: Path,
    *,
    dry_run: bool = False,
    answers: dict[str, list[str]] | None = None,
    interactive: bool = False,
) -> Update:
    """Re-record the run of ``file`` against today's graph and rewrite the file.

    A question that changed (it embeds text an LLM call now writes differently)
    is answered as it was recorded when its options did not change, else by
    ``answers`` (``--answer NODE=VALUE``), else, with ``interactive``, by a person
    at the terminal."""
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import RunOptions
    from graphrun.runtime.graph.config import agents_dir, config_dir
    from graphrun.runtime.replay.regression import rerun_live
    from graphrun.runtime.replay.testing import agent_dir_of
    from graphrun.runtime.replay.transfer import (
        import_runs,
        read_header,
        top_level_runs,
        write_export,
    )

    tops = top_level_runs(file)
    if len(tops) != 1:
        return Update(
            file,
            ",".join(tops) or "?",
            error=f"holds {len(tops)} top-level runs; --update re-records files of one run "
            "(export each run to its own file)",
        )
    top = tops[0]
    if dry_run:
        return Update(file, top)
    with tempfile.TemporaryDirectory(prefix="graphrun-update-") as tmp:
        store = SqliteStore(Path(tmp) / "update.db")
        try:
            import_runs(store, file)
            header = read_header(file)
            events = store.read(top)
            first = events[0]
            assert isinstance(first, RunStarted)
            agent_dir = agent_dir_of(file, header, top, first)
            if agent_dir is None:
                return Update(file, top, error="its agent directory was not found")
            cfg = config_dir(None)
            loaded = load_agent(agent_dir, config_dir=cfg)
            options = RunOptions(
                interactive=False, config_dir=cfg, agents_dir=agents_dir(config=cfg)
            )
            outcome = rerun_live(store, top, loaded, options=options, preflight=False)
            notes: list[str] = []
            was = fold(events)
            if outcome.status == "waiting" and was.status != "waiting":
                outcome = _answer_changed_questions(
                    store, events, outcome, options, answers or {}, interactive, notes
                )
            result = Update(
                file, top, outcome.run_id, list(outcome.reused), list(outcome.performed)
            )
            result.notes = notes
            # An LLM call made for a changed request must have succeeded: a node that
            # goes on with the error as its output is no recording to keep.
            before = {
                slot_of(e) for e in events if isinstance(e, LlmResult) and e.error is not None
            }
            for event in store.read(outcome.run_id):
                if (
                    isinstance(event, LlmResult)
                    and event.error is not None
                    and slot_of(event) not in before
                ):
                    result.error = (
                        f"node '{event.node_id}': the LLM call for its changed request failed "
                        f"({event.error}); the file is unchanged"
                    )
                    return result
            if outcome.status != was.status:
                why = f" ({outcome.error})" if outcome.error else ""
                waiting = (
                    f" at node '{outcome.waiting_at}'"
                    if outcome.status == "waiting" and outcome.waiting_at
                    else ""
                )
                result.error = (
                    f"the re-recorded run ended {outcome.status}{waiting}{why}, the recording "
                    f"{was.status}; the file is unchanged (re-record it by hand: graphrun run, "
                    "then graphrun export)"
                )
                return result
            source = _adopt_reused_children(store, outcome.run_id, Path(tmp))
            partial = file.with_name(file.name + ".partial")
            try:
                with partial.open("w", encoding="utf-8") as fh:
                    write_export(source, outcome.run_id, fh, relative_to=file.parent)
            finally:
                if source is not store:
                    source.close()
            os.replace(partial, file)
            result.written = True
            return result
        except GraphrunError as exc:
            return Update(file, top, error=str(exc))
        finally:
            store.close()


def _answer_changed_questions(
    store: SqliteStore,
    events: list[Any],
    outcome: Any,
    options: Any,
    answers: dict[str, list[str]],
    interactive: bool,
    notes: list[str],
) -> Any:
    """Go on past the questions the re-recorded run stopped at because their text
    changed: the recorded answer when the options are the same (and say so), else an
    ``--answer`` given for the node, else (on a terminal) a person's."""
    from graphrun.eventstore.events import HumanInputReceived
    from graphrun.runtime.engine.driver import Driver, drive
    from graphrun.runtime.replay.regression import LiveOutcome

    recorded = {(e.node_id, e.visit): e for e in events if isinstance(e, HumanInputReceived)}
    given = {node: list(values) for node, values in answers.items()}
    for _ in range(64):  # each round answers one wait; a graph has finitely many
        if outcome.status != "waiting":
            break
        waiting = fold(store.read(outcome.run_id)).waiting
        if waiting is None:
            break
        node = waiting.node_id
        old = recorded.get((node, waiting.visit))
        if given.get(node):
            answer = given[node].pop(0)
            notes.append(f"node '{node}': answered '{answer}' (--answer)")
            options.interactive = False
        elif old is not None and list(old.options) == list(waiting.options):
            answer = old.answer
            notes.append(
                f"node '{node}': its question changed, its options did not: reused the "
                f"recorded answer '{answer}' (by {old.by})"
            )
            options.interactive = False
        elif interactive:
            answer = None
            options.interactive = True
        else:
            break
        options.answers = {node: [answer]} if answer is not None else {}
        run = drive(Driver(store, outcome.run_id, options))
        source = options.effect_source
        outcome = LiveOutcome(
            run.run_id,
            run.status,
            run.output,
            run.error,
            list(getattr(source, "reused", outcome.reused)),
            list(getattr(source, "performed", outcome.performed)),
            run.waiting.node_id if run.waiting is not None else None,
        )
    return outcome


def _adopt_reused_children(store: SqliteStore, run_id: str, tmp: Path) -> SqliteStore:
    """The store to export the re-recorded run ``run_id`` from.

    A child agent whose request did not change was served from the recording: the
    new run's ``ChildRunStarted`` names the recorded child run, whose log says its
    parent is the old run. The export holds the new run only, so such a child (with
    its own descendants) is written as the new run's: the same run id and events,
    its ``RunStarted`` naming the new parent. Returns ``store`` itself when nothing
    was reused, else a store of its own holding the new tree and the adopted ones."""
    from graphrun.runtime.replay.transfer import run_tree

    tree = run_tree(store, run_id)
    reused = [
        event.child_run_id
        for rid in tree
        for event in store.read(rid)
        if isinstance(event, ChildRunStarted) and event.child_run_id not in tree
    ]
    if not reused:
        return store
    adopted = SqliteStore(tmp / "adopted.db")
    try:
        for rid in tree:
            adopted.append(rid, store.read(rid))
        for child in dict.fromkeys(reused):
            for rid in run_tree(store, child):
                events = store.read(rid)
                if rid == child:
                    first = events[0]
                    assert isinstance(first, RunStarted)
                    events = [msgspec.structs.replace(first, parent_run_id=run_id), *events[1:]]
                adopted.append(rid, events)
    except BaseException:
        adopted.close()
        raise
    return adopted


__all__ = ["Update", "update_file"]


def update_suite(
    paths: list[str],
    *,
    dry_run: bool = False,
    answers: dict[str, list[str]] | None = None,
    interactive: bool = False,
) -> int:
    """``graphrun test --update``: replay every file, re-record the divergent ones.

    One line per file that passes, is updated, or cannot be; exit 0 when every file
    replays now (after updating), 1 when one could not be updated (or, with
    ``dry_run``, would be), 2 when there is nothing to test."""
    import sys

    from graphrun.runtime.replay.testing import find_files, replay_file

    files = list(find_files(paths))
    if not files:
        print(f"no recorded runs in {', '.join(paths)}", file=sys.stderr)
        return 2
    code = 0
    for file in files:
        cases = replay_file(file)
        failed = [c for c in cases if not c.ok]
        if not failed:
            print(f"PASS {file}")
            continue
        broken = [c for c in failed if c.result is None]
        if broken:
            print(f"NOT UPDATED {file}: {broken[0].why()}")
            code = 1
            continue
        nodes = sorted(
            {
                d.node_id or "(run)"
                for c in failed
                for d in (c.result.divergences if c.result else [])
            }
        )
        update = update_file(file, dry_run=dry_run, answers=answers, interactive=interactive)
        line = update.line(dry_run)
        if dry_run and not update.error:
            line += f" (divergent: {', '.join(nodes) or '?'})"
        print(line)
        if dry_run or update.error:
            code = 1
            continue
        again = [c for c in replay_file(file) if not c.ok]
        if again:
            print(f"  but it still does not replay: {again[0].why().splitlines()[0]}")
            code = 1
    return code


__all__ += ["update_suite"]
