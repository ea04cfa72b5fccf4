"""Reported heads: what graphrun last told the user about each run of an SQLite file.

SQLite's write-ahead log can lose committed transactions when its ``-wal`` file is
damaged after a crash: recovery stops at the first bad frame and drops everything
after it, silently. A run's log then simply ends earlier (or the run is gone), and
its hash chain still verifies. To notice, the store keeps a small record outside
the database: each time a run ends or waits, one line ``RUN_ID SEQ HASH`` is
appended to ``<database>-reported-heads`` and fsynced. A run whose log is behind
its reported head (a log that ends before that seq, or no run at all) lost
committed events, and ``runs``, ``show``, ``resume`` and ``audit --verify`` say so.
(The hash is kept for a person comparing; a log rewritten in place is the hash
chain's, signed heads' and anchors' business, not this record's.)

The record is independent of signed heads (which make a head unforgeable): it
only answers "did the database go backwards?". It is rewritten (compacted, one
line per run) when it grows past :data:`COMPACT_BYTES`, and after that only once
it has doubled since (a store of many runs compacts to more than that limit: it is
not rewritten at every line), and removed when its database file is created anew.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Appended to the database's path to name the record.
SUFFIX = "-reported-heads"
#: Past this size the record is rewritten with one line per run.
COMPACT_BYTES = 4 * 1024 * 1024


class ReportedHeads:
    """The reported-heads record of one SQLite database file."""

    def __init__(self, database: str | Path) -> None:
        self.path = Path(f"{database}{SUFFIX}")
        # The size past which the record is compacted next: twice what the last
        # compaction left, at least COMPACT_BYTES.
        self._compact_at = COMPACT_BYTES

    def record(self, run_id: str, seq: int, digest: str) -> None:
        """Append (and fsync) that the run's head is ``seq`` / ``digest`` now.

        Best effort: a record that cannot be written (a read-only folder, a full
        disk) never fails the run; it only leaves that head unchecked."""
        line = f"{run_id} {seq} {digest}\n".encode()
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > self._compact_at:
                self._compact_at = max(COMPACT_BYTES, 2 * self._compact())

    def heads(self) -> dict[str, tuple[int, str]]:
        """The last reported head of each run: ``run_id -> (seq, hash)`` (a head
        only grows, so the highest seq wins; damaged lines are skipped)."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return {}
        found: dict[str, tuple[int, str]] = {}
        for raw in data.splitlines():
            parts = raw.decode("utf-8", "replace").split()
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            run_id, seq, digest = parts[0], int(parts[1]), parts[2]
            if seq >= found.get(run_id, (0, ""))[0]:
                found[run_id] = (seq, digest)
        return found

    def forget(self) -> None:
        """Drop the record (its database file is new)."""
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _compact(self) -> int:
        """Rewrite the record with one line per run, atomically; its size now."""
        heads = self.heads()
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(
            f"{run_id} {seq} {digest}\n".encode() for run_id, (seq, digest) in sorted(heads.items())
        )
        with contextlib.suppress(OSError):
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        return len(data)


__all__ = ["SUFFIX", "ReportedHeads"]
