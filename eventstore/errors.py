"""The root of graphrun's error tree and the errors of the event store.

Every error a user can see derives from :class:`GraphrunError`. It carries a
message, optionally where it happened (``file:line``, a node id, a run id) and a
hint that points at the fix; the CLI prints ``str(err)`` as one line on stderr and
exits with the class's ``exit_code``.

::

    GraphrunError (exit 2)
    ├── StoreError
    │   ├── CorruptStoreError         not a graphrun database, or damaged
    │   │   └── BrokenLogError        a run's log does not verify (names the seq)
    │   ├── UnknownRunError           no run with that id
    │   ├── ConcurrentAppendError     another writer extended the run first
    │   ├── LeaseHeldError            another live process holds the run
    │   ├── StoreFullError            the disk is full
    │   ├── StoreReadOnlyError        the database cannot be written
    │   ├── StoreIOError              the disk reported an I/O error
    │   └── StoreLockedError          another process kept the database locked
    ├── (runtime/errors.py adds the graph, template, run and replay errors)
    └── ...
"""

from __future__ import annotations

from typing import ClassVar


class GraphrunError(Exception):
    """Base of every error graphrun reports to a user."""

    exit_code: ClassVar[int] = 2

    def __init__(self, message: str, *, hint: str | None = None, where: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.where = where

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text = f"{text} ({self.hint})"
        return text


class StoreError(GraphrunError):
    """A problem with the event store."""


class CorruptStoreError(StoreError):
    """The database file is damaged or belongs to something else.

    When the damage is in one run, ``run_id`` names it and ``seq`` the first
    damaged event (0 when no event is to blame): a listing skips that run."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        where: str | None = None,
        run_id: str | None = None,
        seq: int = 0,
    ):
        super().__init__(message, hint=hint, where=where)
        self.run_id = run_id
        self.seq = seq


class UnknownRunError(StoreError):
    """No run has the given id."""


class ConcurrentAppendError(StoreError):
    """Another writer appended to the run first: the (run_id, seq) key is taken."""


class LeaseHeldError(StoreError):
    """Another live process is extending the run."""


class BrokenLogError(CorruptStoreError):
    """A run's stored events do not verify; nothing may be appended to it."""

    def __init__(
        self, message: str, *, seq: int, hint: str | None = None, run_id: str | None = None
    ):
        super().__init__(message, hint=hint, run_id=run_id, seq=seq)


class StoreFullError(StoreError):
    """The disk (or file system quota) is full."""


class StoreReadOnlyError(StoreError):
    """The database file or its folder cannot be written."""


class StoreIOError(StoreError):
    """The operating system reported an I/O error on the database."""


class StoreUnreachableError(StoreError):
    """The database server could not be reached, or the connection to it broke."""


class StoreLockedError(StoreError):
    """Another process kept the database locked past the wait."""
