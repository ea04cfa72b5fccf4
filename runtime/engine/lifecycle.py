"""Run lifecycle operations outside the driver loop: cancel and fork."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable

from graphrun.eventstore.errors import GraphrunError, LeaseHeldError
from graphrun.eventstore.events import ChildCancelled, RunCancelled
from graphrun.eventstore.fold import TERMINAL, fold
from graphrun.eventstore.store import Lease, Store
from graphrun.runtime.errors import AnswerError, RunError

#: How long ``graphrun cancel`` waits for the process driving a run to cancel it.
CANCEL_WAIT_SECONDS = 30.0
_TERMINAL = TERMINAL


def whoami(as_user: str | None = None) -> str:
    if as_user:
        return as_user
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"


def cancel_run(store: Store, run_id: str, *, reason: str, by: str | None = None) -> list[str]:
    """Cancel a run and, recursively, its still-running children. Returns the ids cancelled.

    Raises :class:`LeaseHeldError` while another live process drives the run
    (:func:`cancel` asks that process instead)."""
    store.require_intact(run_id)  # never extend a log that does not verify
    state = fold(store.read(run_id))
    if state.terminal:
        raise AnswerError(f"run {run_id} has already {state.status}")
    cancelled: list[str] = []
    with store.leased(run_id):
        # What the log says now that no one else can extend it.
        state = fold(store.read(run_id))
        if state.terminal:
            raise AnswerError(f"run {run_id} has already {state.status}")
        for child, status in state.children.items():
            if status == "running" and store.has_run(child):
                child_state = fold(store.read(child))
                if not child_state.terminal:
                    cancelled += cancel_run(
                        store, child, reason=f"parent run {run_id} was cancelled", by=by
                    )
                store.append(run_id, [ChildCancelled(child_run_id=child, reason=reason)])
        store.append(run_id, [RunCancelled(reason=reason, by=whoami(by))], sync=True)
        _sign_head(store, run_id)
    cancelled.append(run_id)
    return cancelled


def _sign_head(store: Store, run_id: str) -> None:
    """Sign the head a cancellation leaves, when a head key is configured."""
    import logging

    from graphrun.runtime.decisions.heads import sign_head

    try:
        sign_head(store, run_id)
    except GraphrunError as exc:
        logging.getLogger("graphrun.run").warning(
            "run %s: the head was not signed: %s", run_id, exc
        )


def cancel(
    store: Store,
    run_id: str,
    *,
    reason: str,
    by: str | None = None,
    wait: float = CANCEL_WAIT_SECONDS,
    asked: Callable[[Lease | None], None] | None = None,
) -> list[str]:
    """Cancel a run, whoever drives it; returns the ids of the runs cancelled.

    A run no live process holds (waiting, interrupted, its process gone) is
    cancelled here, with its running children. A run another process drives is
    asked to stop: the request is recorded (:meth:`Store.request_cancel`, not an
    event: only the run's writer appends to its log), ``asked`` is called, and
    this waits up to ``wait`` seconds for the run to end. The driver sees the
    request, stops its effects and records ``RunCancelled`` by ``by``. Raises
    :class:`AnswerError` when the run ended otherwise, :class:`RunError` when it
    is still running after ``wait`` (the request stays: the run is cancelled when
    its driver next looks), and ``CancelRefused`` when the graph lets only its
    approvers cancel (``settings.cancel_by: approvers``) and ``by`` is none of them."""
    from graphrun.runtime.decisions.policy import check_canceller

    who = whoami(by)
    # Refused before anything is recorded or asked of the driving process.
    check_canceller(store.read(run_id, upto=1), who)
    if not store.is_live(run_id):
        try:
            return cancel_run(store, run_id, reason=reason, by=who)
        except LeaseHeldError:
            pass  # a process took the run meanwhile: ask it
    store.request_cancel(run_id, who, reason)
    if asked is not None:
        asked(store.lease(run_id))
    deadline = time.monotonic() + wait
    while True:
        # The driver records the run's end before it lets go of the run: a run no
        # one holds any more either ended or stopped short of its end (a wait for
        # a person, an interrupt), and is then cancelled here.
        live = store.is_live(run_id)
        status = store.run(run_id).status
        if status == "cancelled":
            return [run_id]
        if status in _TERMINAL:
            raise AnswerError(f"run {run_id} {status} before it could be cancelled")
        if not live:
            try:
                return cancel_run(store, run_id, reason=reason, by=who)
            except LeaseHeldError:
                pass  # taken again: that process sees the request
        if time.monotonic() >= deadline:
            lease = store.lease(run_id)
            holder = f"process {lease.pid} on {lease.host}" if lease else "its process"
            raise RunError(
                f"run {run_id} is still running {wait:g}s after {holder} was asked to cancel it",
                hint="the request stays recorded: the run is cancelled when that process next "
                f"looks; `graphrun show {run_id}` tells when",
            )
        time.sleep(0.1)


def run_tree(store: Store, run_id: str) -> list[str]:
    """A run and its descendants, parents first."""
    out = [run_id]
    seen = {run_id}
    i = 0
    while i < len(out):
        for row in sorted(store.runs(parent=out[i]), key=lambda r: r.started_at):
            if row.run_id not in seen:  # a crafted log may link a run to itself
                seen.add(row.run_id)
                out.append(row.run_id)
        i += 1
    return out
