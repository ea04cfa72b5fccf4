"""Datasette browses every table and view of an event database (through its own
test client, on a real file): no HTTP 500, and the bodies are readable JSON."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import warnings
from pathlib import Path

import pytest

from graphrun.eventstore.store import SqliteStore
from tests.conformance.store_contract import started, step

V3 = Path(__file__).resolve().parents[1] / "data" / "events-schema-v3.db"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_every_table_and_view_browses(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    shutil.copy(V3, db)  # recorded runs of every example, LLM calls included
    store = SqliteStore(db)
    store.append("waiting", [started(), *step("a", 1, 1, None)])
    store.acquire_lease("waiting")
    store.close()
    with sqlite3.connect(db) as conn:
        names = [
            n
            for (n,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            )
        ]
        (first_id,) = conn.execute("SELECT min(id) FROM events").fetchone()
    conn.close()
    assert {"events", "run_heads", "leases", "runs", "run_events"} <= set(names)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from datasette.app import Datasette

    async def browse() -> dict[str, int]:
        ds = Datasette([str(db)])
        statuses: dict[str, int] = {}
        paths = [f"/events/{name}" for name in names]
        paths += [f"/events/{name}.json?_shape=array" for name in names]
        paths += [
            f"/events/events/{first_id}",
            "/events/runs?status=completed",
            "/events/run_events?type=LlmCalled",
            "/events.json?sql=select+json_extract(body,'$.usage')+as+usage+from+events"
            "+where+type='LlmCalled'&_shape=array",
        ]
        for path in paths:
            response = await ds.client.get(path)
            statuses[path] = response.status_code
        usage = await ds.client.get(paths[-1])
        assert usage.json() and all(row["usage"] for row in usage.json())
        rows = await ds.client.get("/events/run_events.json?_shape=array&_size=5")
        assert {"run_id", "seq", "type", "body", "hash"} <= set(rows.json()[0])
        return statuses

    statuses = asyncio.run(browse())
    assert {p: s for p, s in statuses.items() if s != 200} == {}
