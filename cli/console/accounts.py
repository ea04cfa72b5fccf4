"""The console's own tables: accounts, passkeys, sessions, invites and API tokens.

They live in the event database beside the runs (an SQLite file or PostgreSQL),
made and upgraded by :data:`MIGRATIONS` (one list of statements per version,
recorded in ``console_meta``), never in the events themselves: an account is
not a fact of any run. Secrets (session cookies, invite links, API tokens) are
stored only as their SHA-256, so a copy of the database opens no session.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: Statements per console schema version; a database at version N runs N+1...
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE console_accounts (
            name TEXT PRIMARY KEY,
            created_at DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE console_passkeys (
            credential_id TEXT PRIMARY KEY,
            account TEXT NOT NULL REFERENCES console_accounts(name),
            public_key TEXT NOT NULL,
            sign_count BIGINT NOT NULL DEFAULT 0,
            rp_id TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX console_passkeys_account ON console_passkeys (account)",
        """CREATE TABLE console_sessions (
            token_hash TEXT PRIMARY KEY,
            account TEXT NOT NULL REFERENCES console_accounts(name),
            csrf TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE console_invites (
            token_hash TEXT PRIMARY KEY,
            account TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            used_at DOUBLE PRECISION
        )""",
        """CREATE TABLE console_tokens (
            token_hash TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            label TEXT NOT NULL DEFAULT '',
            created_at DOUBLE PRECISION NOT NULL
        )""",
    ],
}
VERSION = max(MIGRATIONS)

SESSION_SECONDS = 12 * 3600
INVITE_SECONDS = 24 * 3600


def digest(secret: str) -> str:
    """What is stored for a secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Passkey:
    credential_id: str  # base64url, as WebAuthn names it
    account: str
    public_key: bytes  # COSE_Key, as the authenticator gave it
    sign_count: int
    rp_id: str


@dataclass(frozen=True)
class Session:
    account: str
    csrf: str
    expires_at: float


class Accounts:
    """The console tables over one DB-API connection (sqlite3 or psycopg)."""

    def __init__(self, db: str) -> None:
        from graphrun.cli.options import db_url, open_store

        self._lock = threading.Lock()
        url = db_url(db)
        if url is not None:
            import psycopg

            open_store(db, create=True).close()  # the event tables first
            self.conn: Any = psycopg.connect(url, autocommit=True)
            self.mark = "%s"
            self.kind = "postgresql"
        else:
            from graphrun.runtime.graph.config import db_path

            open_store(db, create=True).close()
            self.conn = sqlite3.connect(
                db_path(db), isolation_level=None, check_same_thread=False, timeout=10
            )
            self.mark = "?"
            self.kind = "sqlite"
        self._migrate()

    def close(self) -> None:
        self.conn.close()

    # -- plumbing ----------------------------------------------------------------

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self.mark)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            if self.kind == "sqlite":
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                    self.conn.execute("COMMIT")
                except BaseException:
                    self.conn.execute("ROLLBACK")
                    raise
            else:
                with self.conn.transaction():
                    yield self.conn

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return [tuple(r) for r in self.conn.execute(self._sql(sql), tuple(args)).fetchall()]

    def _one(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    def _migrate(self) -> None:
        with self._tx() as conn:
            if self.kind == "postgresql":
                conn.execute("SELECT pg_advisory_xact_lock(1735552611)")  # "grnc"
            conn.execute(
                "CREATE TABLE IF NOT EXISTS console_meta (key TEXT PRIMARY KEY, value TEXT)"
            )
            found = conn.execute(
                "SELECT value FROM console_meta WHERE key = 'schema_version'"
            ).fetchone()
            version = int(found[0]) if found else 0
            for number in range(version + 1, VERSION + 1):
                for statement in MIGRATIONS[number]:
                    conn.execute(statement)
            if version != VERSION:
                conn.execute(
                    self._sql(
                        "INSERT INTO console_meta (key, value) VALUES ('schema_version', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                    ),
                    (str(VERSION),),
                )

    # -- accounts and invites ----------------------------------------------------

    def invite(self, account: str, *, now: float | None = None) -> str:
        """A one-time invitation secret for ``account`` (made on first use)."""
        now = time.time() if now is None else now
        secret = secrets.token_urlsafe(32)
        with self._tx() as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO console_invites (token_hash, account, created_at, expires_at) "
                    "VALUES (?, ?, ?, ?)"
                ),
                (digest(secret), account, now, now + INVITE_SECONDS),
            )
        return secret

    def invited(self, secret: str) -> str | None:
        """The account an unused, unexpired invitation is for."""
        row = self._one(
            "SELECT account FROM console_invites WHERE token_hash = ? AND used_at IS NULL "
            "AND expires_at > ?",
            (digest(secret), time.time()),
        )
        return str(row[0]) if row else None

    def register(self, secret: str, passkey: Passkey) -> bool:
        """Use the invitation: make its account (if new) with ``passkey``. False when
        the invitation was used meanwhile."""
        now = time.time()
        with self._tx() as conn:
            used = conn.execute(
                self._sql(
                    "UPDATE console_invites SET used_at = ? WHERE token_hash = ? "
                    "AND used_at IS NULL AND expires_at > ? AND account = ?"
                ),
                (now, digest(secret), now, passkey.account),
            )
            if used.rowcount != 1:
                return False
            conn.execute(
                self._sql(
                    "INSERT INTO console_accounts (name, created_at) VALUES (?, ?) "
                    "ON CONFLICT (name) DO NOTHING"
                ),
                (passkey.account, now),
            )
            conn.execute(
                self._sql(
                    "INSERT INTO console_passkeys "
                    "(credential_id, account, public_key, sign_count, rp_id, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (
                    passkey.credential_id,
                    passkey.account,
                    passkey.public_key.hex(),
                    passkey.sign_count,
                    passkey.rp_id,
                    now,
                ),
            )
        return True

    def passkey(self, credential_id: str) -> Passkey | None:
        row = self._one(
            "SELECT credential_id, account, public_key, sign_count, rp_id "
            "FROM console_passkeys WHERE credential_id = ?",
            (credential_id,),
        )
        return _passkey(row) if row else None

    def passkeys(self, account: str | None = None) -> list[Passkey]:
        if account is None:
            rows = self._all(
                "SELECT credential_id, account, public_key, sign_count, rp_id "
                "FROM console_passkeys ORDER BY account, created_at"
            )
        else:
            rows = self._all(
                "SELECT credential_id, account, public_key, sign_count, rp_id "
                "FROM console_passkeys WHERE account = ? ORDER BY created_at",
                (account,),
            )
        return [_passkey(r) for r in rows]

    def used(self, credential_id: str, sign_count: int) -> None:
        with self._tx() as conn:
            conn.execute(
                self._sql("UPDATE console_passkeys SET sign_count = ? WHERE credential_id = ?"),
                (sign_count, credential_id),
            )

    # -- sessions ----------------------------------------------------------------

    def open_session(self, account: str) -> tuple[str, Session]:
        """A new session: its cookie secret (never stored) and the session."""
        now = time.time()
        secret = secrets.token_urlsafe(32)
        session = Session(account, secrets.token_urlsafe(32), now + SESSION_SECONDS)
        with self._tx() as conn:
            conn.execute(self._sql("DELETE FROM console_sessions WHERE expires_at < ?"), (now,))
            conn.execute(
                self._sql(
                    "INSERT INTO console_sessions (token_hash, account, csrf, created_at, "
                    "expires_at) VALUES (?, ?, ?, ?, ?)"
                ),
                (digest(secret), account, session.csrf, now, session.expires_at),
            )
        return secret, session

    def session(self, secret: str) -> Session | None:
        row = self._one(
            "SELECT account, csrf, expires_at FROM console_sessions "
            "WHERE token_hash = ? AND expires_at > ?",
            (digest(secret), time.time()),
        )
        return Session(str(row[0]), str(row[1]), float(row[2])) if row else None

    def close_session(self, secret: str) -> None:
        with self._tx() as conn:
            conn.execute(
                self._sql("DELETE FROM console_sessions WHERE token_hash = ?"), (digest(secret),)
            )

    # -- API tokens --------------------------------------------------------------

    def new_token(self, principal: str, label: str = "") -> str:
        secret = "grt_" + secrets.token_urlsafe(32)
        with self._tx() as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO console_tokens (token_hash, principal, label, created_at) "
                    "VALUES (?, ?, ?, ?)"
                ),
                (digest(secret), principal, label, time.time()),
            )
        return secret

    def token_principal(self, secret: str) -> str | None:
        row = self._one(
            "SELECT principal FROM console_tokens WHERE token_hash = ?", (digest(secret),)
        )
        return str(row[0]) if row else None


def _passkey(row: tuple[Any, ...]) -> Passkey:
    return Passkey(str(row[0]), str(row[1]), bytes.fromhex(row[2]), int(row[3]), str(row[4]))


__all__ = ["Accounts", "Passkey", "Session", "digest"]
