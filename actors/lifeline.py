"""The lifeline of a graphrun process: ``python lifeline.py GRAPHRUN_OWNER=<mark>``.

Started by :mod:`graphrun.actors.process` with its first child, in a session of its
own, reading a pipe only its graphrun process writes to: ``+ PGID`` for each child's
process group, ``- PGID`` once the group is gone. The pipe closes when that process
ends, however it ends (``kill -9`` included); the lifeline then kills the groups
still listed and every process whose environment carries the mark (what left the
group), and exits. Standard library only, run with ``-I -S``: it starts in
milliseconds and never imports graphrun.
"""

import os
import signal
import sys


def main() -> None:
    mark = b"\0" + sys.argv[1].encode() + b"\0"
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        sign, _, pgid = line.strip().partition(b" ")
        if pgid.isdigit():
            if sign == b"+":
                groups.add(int(pgid))
            else:
                groups.discard(int(pgid))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    if not os.path.isdir("/proc"):
        return  # no environments to read here: the groups were all it could end
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                carries = mark in b"\0" + fh.read()
            if carries:
                os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
