"""The console's tables in the event database: made by their own migrations, on a real
SQLite file and a real PostgreSQL; invitations are one-time; secrets are stored hashed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from graphrun.cli.console.accounts import VERSION, Accounts, Passkey, digest
from tests.support.pg import pg_server, pg_url  # noqa: F401  (fixtures)


def _passkey(account: str, credential: str = "cred-1") -> Passkey:
    return Passkey(credential, account, b"\xa5\x01\x02", 0, "localhost")


def _exercise(accounts: Accounts) -> None:
    secret = accounts.invite("alice")
    assert accounts.invited(secret) == "alice"
    assert accounts.invited("not-a-secret") is None
    assert accounts.register(secret, _passkey("alice"))
    assert not accounts.register(secret, _passkey("alice", "cred-2"))  # used once only
    assert accounts.invited(secret) is None
    assert [p.credential_id for p in accounts.passkeys("alice")] == ["cred-1"]
    assert accounts.passkey("cred-1") == _passkey("alice")
    accounts.used("cred-1", 7)
    assert accounts.passkey("cred-1").sign_count == 7  # type: ignore[union-attr]

    cookie, session = accounts.open_session("alice")
    assert accounts.session(cookie) == session and session.account == "alice"
    accounts.close_session(cookie)
    assert accounts.session(cookie) is None

    token = accounts.new_token("bot")
    assert accounts.token_principal(token) == "bot"
    assert accounts.token_principal(token + "x") is None


def test_accounts_in_an_sqlite_event_database(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    accounts = Accounts(str(db))
    try:
        _exercise(accounts)
        secret = accounts.invite("bob")
    finally:
        accounts.close()
    Accounts(str(db)).close()  # opening again migrates nothing
    conn = sqlite3.connect(db)
    version = conn.execute("SELECT value FROM console_meta").fetchone()[0]
    stored = [r[0] for r in conn.execute("SELECT token_hash FROM console_invites")]
    conn.close()
    assert int(version) == VERSION
    assert digest(secret) in stored and secret not in stored  # only the hash


def test_accounts_in_a_postgresql_event_database(pg_url: str) -> None:  # noqa: F811
    accounts = Accounts(pg_url)
    try:
        _exercise(accounts)
    finally:
        accounts.close()
    again = Accounts(pg_url)
    try:
        assert again.passkeys("alice")[0].credential_id == "cred-1"
    finally:
        again.close()


def test_the_event_store_still_opens_a_database_with_accounts(tmp_path: Path) -> None:
    from graphrun.cli.options import open_store

    db = tmp_path / "events.db"
    Accounts(str(db)).close()
    store = open_store(str(db))
    try:
        assert store.runs() == []
    finally:
        store.close()


@pytest.mark.parametrize("name", ["", "a b", "x,y"])
def test_an_invitation_names_one_principal(tmp_path: Path, name: str) -> None:
    from click.testing import CliRunner

    from graphrun.cli import cli

    result = CliRunner().invoke(
        cli,
        ["serve", "--db", str(tmp_path / "e.db"), "--no-serve", "--port", "0", "--invite", name],
    )
    assert "a principal is one word" in str(result.exception)
    assert not (tmp_path / "e.db").exists()  # refused before anything is made
