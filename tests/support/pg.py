"""A real, throw-away PostgreSQL server for the tests (and the benchmark).

:func:`start_server` finds ``initdb`` and ``pg_ctl`` (on ``$PATH``, else Debian's
``/usr/lib/postgresql/*/bin``), installing Debian's ``postgresql`` package with
apt-get when they are missing and this process is root; makes a data directory
in a fresh temporary directory; and starts the server on a Unix socket in it
(no TCP port is opened). ``initdb`` refuses to run as root: as root the server
runs as the ``postgres`` user (made by the package) through ``runuser``.

As a pytest plugin it gives the session fixture ``pg_server`` and the fixture
``pg_url`` (a fresh schema per test, named in the URL's ``search_path``). When no
server can be had the tests fail, with the reason; only ``GRAPHRUN_SKIP_PG=1``
on a machine that is not CI (``CI`` unset) turns that into a skip.

Run as a script, it starts a server and prints its URL until interrupted;
``--ensure`` only finds or installs the binaries (``make test`` does that first)::

    python -m tests.support.pg
    python -m tests.support.pg --ensure
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

SUPERUSER = "graphrun"


class NoPostgres(RuntimeError):
    """No PostgreSQL server could be started here."""


@dataclass
class PgServer:
    """A running throw-away server."""

    bindir: Path
    root: Path  # the temporary directory: data/ and the socket
    port: int
    run_as: str | None
    opts: str = ""  # the server's options (pg_ctl -o), for start()

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres", schema: str | None = None) -> str:
        url = f"postgresql://{SUPERUSER}@/{dbname}?host={quote(str(self.root), safe='')}"
        url += f"&port={self.port}"
        if schema:
            url += "&options=" + quote(f"-csearch_path={schema}", safe="")
        return url

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        out = subprocess.run(
            [
                str(self.bindir / "psql") if (self.bindir / "psql").exists() else "psql",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.root),
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                dbname,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    def new_schema(self) -> str:
        """A fresh schema's URL (the store makes its tables there)."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE SCHEMA {name}")
        return self.url(schema=name)

    def halt(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``: every session is
        cut, as in a crash), keeping its data for :meth:`start`."""
        _as_user(
            [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "stop"],
            self.run_as,
        )

    def start(self) -> None:
        """Start the server (again) on its data directory, socket and port."""
        _as_user(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-o",
                self.opts,
                "-l",
                str(self.root / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            self.run_as,
        )

    def stop(self) -> None:
        _as_user(
            [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "stop"],
            self.run_as,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _as_user(cmd: list[str], user: str | None, *, check: bool = True) -> None:
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NoPostgres(
            f"{' '.join(cmd)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )


def find_bindir(install: bool = True) -> Path:
    """The directory of ``initdb`` and ``pg_ctl``; installs PostgreSQL as root."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    if install and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise NoPostgres(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
        return find_bindir(install=False)
    raise NoPostgres(
        "no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin, and cannot install "
        "Debian's postgresql package (needs root and apt-get)"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(*, fsync: bool = False) -> PgServer:
    """Start a throw-away server; ``fsync=False`` (tests) trades crash safety of the
    throw-away data for speed, ``True`` keeps PostgreSQL's durable defaults."""
    bindir = find_bindir()
    run_as: str | None = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise NoPostgres("running as root and there is no 'postgres' user") from None
        run_as = "postgres"
    root = Path(tempfile.mkdtemp(prefix="graphrun-pg-"))
    os.chmod(root, 0o755)
    data = root / "data"
    if run_as is not None:
        shutil.chown(root, user=run_as)
    port = _free_port()
    opts = f"-k {root} -p {port} -c listen_addresses='' -c max_connections=200"
    if not fsync:
        opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    server = PgServer(bindir, root, port, run_as, opts)
    try:
        _as_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            run_as,
        )
        server.start()
    except BaseException:
        log = root / "server.log"
        detail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        if detail:
            raise NoPostgres(f"PostgreSQL did not start: {detail}") from None
        raise
    return server


def _server_or_skip() -> Iterator[PgServer]:
    try:
        server = start_server()
    except NoPostgres as exc:
        if os.environ.get("GRAPHRUN_SKIP_PG") == "1" and os.environ.get("CI", "") in ("", "0"):
            pytest.skip(f"no PostgreSQL server ({exc}); GRAPHRUN_SKIP_PG=1 skips these tests")
        pytest.fail(
            f"the PostgreSQL tests need a server and none could be started: {exc} "
            "(on a developer machine, GRAPHRUN_SKIP_PG=1 skips them)",
            pytrace=False,
        )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real PostgreSQL server for the test session."""
    yield from _server_or_skip()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """The URL of a fresh, empty schema on the session's server."""
    return pg_server.new_schema()


def _ensure() -> int:
    """``--ensure``: find (or, as root, install) PostgreSQL before the tests run,
    outside any test's time limit. Exit 1 when there is none, unless the PostgreSQL
    tests are to be skipped (``GRAPHRUN_SKIP_PG=1`` outside CI)."""
    import sys

    try:
        print(f"PostgreSQL: {find_bindir()}", file=sys.stderr)
    except NoPostgres as exc:
        if os.environ.get("GRAPHRUN_SKIP_PG") == "1" and os.environ.get("CI", "") in ("", "0"):
            print(f"PostgreSQL: none ({exc}); its tests will be skipped", file=sys.stderr)
            return 0
        print(f"PostgreSQL: none: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--ensure"]:
        sys.exit(_ensure())
    srv = start_server()
    print(srv.url(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
