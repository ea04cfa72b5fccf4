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

Only a transaction still in the ``-wal`` file can be lost that way: once a
checkpoint has copied every frame of the WAL into the database file (and synced
it), what was committed before it is safe. So the store checkpoints now and then
(whenever the record grows past a multiple of :data:`MARK_BYTES`, whichever
process wrote that line) and, when the checkpoint was complete, appends a mark
``~ OFFSET``: every line before byte OFFSET (the record's size when the
checkpoint began) is covered. Only the heads
after the last mark are checked (:meth:`ReportedHeads.unchecked`), so ``runs``
and ``show`` on a store of 100,000 runs read the record's tail, not all of it.
A checkpoint a reader holds back is not complete: no mark, and its heads stay
checked until a later one is.

The record is independent of signed heads (which make a head unforgeable): it
only answers "did the database go backwards?". It is rewritten (compacted, one
line per run, the covered ones first and the mark kept) when it grows past
:data:`COMPACT_BYTES`, and after that only once it has doubled since (a store of
many runs compacts to more than that limit: it is not rewritten at every line),
and removed when its database file is created anew.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

#: Appended to the database's path to name the record.
SUFFIX = "-reported-heads"
#: Past this size the record is rewritten with one line per run.
COMPACT_BYTES = 4 * 1024 * 1024
#: A store tries a checkpoint (and a mark) each time the record grows past a
#: multiple of this many bytes (about 90 heads).
MARK_BYTES = 8 * 1024
#: The first bytes of a mark line.
MARK = b"~ "


class ReportedHeads:
    """The reported-heads record of one SQLite database file."""

    def __init__(self, database: str | Path) -> None:
        self.path = Path(f"{database}{SUFFIX}")
        # The size past which the record is compacted next: twice what the last
        # compaction left, at least COMPACT_BYTES.
        self._compact_at = COMPACT_BYTES

    def record(self, run_id: str, seq: int, digest: str) -> bool:
        """Append (and fsync) that the run's head is ``seq`` / ``digest`` now;
        whether a checkpoint and :meth:`mark` are due (the line crossed a multiple
        of :data:`MARK_BYTES`).

        Best effort: a record that cannot be written (a read-only folder, a full
        disk) never fails the run; it only leaves that head unchecked."""
        line = f"{run_id} {seq} {digest}\n".encode()
        size = self._append(line)
        if size is None:
            return False
        if size > self._compact_at:
            self._compact_at = max(COMPACT_BYTES, 2 * self._compact())
        return size // MARK_BYTES != (size - len(line)) // MARK_BYTES

    def size(self) -> int | None:
        """The record's size in bytes now (0 if there is none), or ``None`` if it
        cannot be read."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0
        except OSError:
            return None

    def mark(self, covered: int) -> None:
        """Append (and fsync) that every line before byte ``covered`` was
        checkpointed into the database file. Best effort, like :meth:`record`."""
        self._append(MARK + f"{covered}\n".encode())

    def _append(self, data: bytes) -> int | None:
        """Append ``data`` and fsync it; the record's size then, or ``None`` when it
        could not be written."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
                return os.fstat(fd).st_size
            finally:
                os.close(fd)
        except OSError:
            return None

    def heads(self) -> dict[str, tuple[int, str]]:
        """The last reported head of each run: ``run_id -> (seq, hash)`` (a head
        only grows, so the highest seq wins; damaged lines and marks are skipped)."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return {}
        return _parse(data)

    def unchecked(self) -> dict[str, tuple[int, str]]:
        """:meth:`heads` of the lines after the last mark's covered offset: the
        heads a damaged WAL could still have lost. Reads the record from its end
        back to that mark only."""
        try:
            with open(self.path, "rb") as fh:
                end = fh.seek(0, os.SEEK_END)
                covered = _last_mark(fh, end)
                fh.seek(covered)
                return _parse(fh.read())
        except OSError:
            return {}

    def forget(self) -> None:
        """Drop the record (its database file is new)."""
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _compact(self) -> int:
        """Rewrite the record with one line per run, atomically (the covered heads,
        then a mark, then the rest); its size now."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return 0
        covered = _last_mark_in(data)
        before, after = _parse(data[:covered]), _parse(data[covered:])
        for run_id in after:
            before.pop(run_id, None)
        head = _lines(before)
        out = head + (MARK + f"{len(head)}\n".encode() if covered else b"") + _lines(after)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(OSError):
            with open(tmp, "wb") as fh:
                fh.write(out)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        return len(out)


def _lines(heads: dict[str, tuple[int, str]]) -> bytes:
    return b"".join(
        f"{run_id} {seq} {digest}\n".encode() for run_id, (seq, digest) in sorted(heads.items())
    )


def _parse(data: bytes) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for raw in data.splitlines():
        parts = raw.decode("utf-8", "replace").split()
        if len(parts) != 3 or not parts[1].isdigit():
            continue  # a damaged line, or a mark
        run_id, seq, digest = parts[0], int(parts[1]), parts[2]
        if seq >= found.get(run_id, (0, ""))[0]:
            found[run_id] = (seq, digest)
    return found


def _mark_offset(line: bytes) -> int | None:
    """The covered offset of a mark line, or ``None`` (not a mark, or damaged)."""
    if not line.startswith(MARK):
        return None
    value = line[len(MARK) :].strip()
    return int(value) if value.isdigit() else None


def _find_mark(data: bytes, base: int = 0) -> int | None:
    """The covered offset of the last mark line in ``data`` (which starts at byte
    ``base`` of the record), or ``None``. A mark never covers past itself."""
    end = len(data)
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        found = _mark_offset(data[start:end])
        if found is not None:
            return min(found, base + start)
        end = start
    return None


def _last_mark_in(data: bytes) -> int:
    """The covered offset of the record ``data`` (0: no mark)."""
    return _find_mark(data) or 0


def _last_mark(fh: BinaryIO, end: int) -> int:
    """:func:`_last_mark_in` of the open record, read backwards in growing chunks."""
    chunk = 16 * 1024
    while True:
        start = max(0, end - chunk)
        fh.seek(start)
        data = fh.read(end - start)
        if start == 0:
            return _last_mark_in(data)
        cut = data.find(b"\n") + 1  # the first line may be cut short: skip it
        if cut:
            found = _find_mark(data[cut:], start + cut)
            if found is not None:
                return found
        chunk *= 4


__all__ = ["MARK_BYTES", "SUFFIX", "ReportedHeads"]
