"""Attune's tables and writes, for the tests, from the seed documents' facts (tests/seeds.py; never
from exporter/demo/): `queue_stats` is the CREATE TABLE of seed 000 (its migration
20250127000001_queue_stats.sql) executed as the seed prints it; `pack`, `action` and
`execution` are the columns, constraints and enum the reference's queue-layouts.md section 3
states (read from Attune's migrations). Rows are written as the seed says the executor writes
them: one queue_stats row per action, upserted (INSERT ... ON CONFLICT DO UPDATE) with
last_updated NOW() on every queue change, deleted when the queue empties.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from tests import seeds

STATUSES = tuple(seeds.attune_execution_statuses())
FINAL = ("completed", "failed", "cancelled", "timeout", "abandoned")  # an execution that ended
UNFINISHED = tuple(status for status in STATUSES if status not in FINAL)


def schema_ddl(schema: str = "attune") -> str:
    statuses = ", ".join(f"'{status}'" for status in STATUSES)
    # "Every migration runs with SET search_path TO attune, public" (queue-layouts.md)
    queue_stats = seeds.attune_queue_stats_ddl(schema).replace("attune.", f"{schema}.")
    return f"""
CREATE SCHEMA IF NOT EXISTS {schema};
SET search_path TO {schema}, public;
CREATE TYPE execution_status_enum AS ENUM ({statuses});
CREATE TABLE pack (
    id BIGSERIAL PRIMARY KEY,
    ref TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL
);
CREATE TABLE action (
    id BIGSERIAL PRIMARY KEY,
    ref TEXT NOT NULL UNIQUE CHECK (ref = LOWER(ref)) CHECK (ref ~ '^[^.]+\\.[^.]+$'),
    pack BIGINT NOT NULL REFERENCES pack(id) ON DELETE CASCADE,
    pack_ref TEXT NOT NULL,
    label TEXT NOT NULL,
    entrypoint TEXT NOT NULL
);
CREATE TABLE execution (
    id BIGSERIAL PRIMARY KEY,
    action BIGINT REFERENCES action(id),
    action_ref TEXT NOT NULL,
    status execution_status_enum NOT NULL DEFAULT 'requested'
);
CREATE INDEX idx_execution_action_status ON execution(action, status);
{queue_stats}
CREATE INDEX idx_queue_stats_last_updated ON queue_stats(last_updated);
RESET search_path;
"""


class Attune:
    """An Attune database written the way the seed says its executor writes it."""

    def __init__(self, dsn: str, schema: str = "attune") -> None:
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.schema = schema
        self.connection.execute(f"SET search_path TO {schema}, public")

    def create_schema(self) -> Attune:
        self.connection.execute(schema_ddl(self.schema))
        self.connection.execute(f"SET search_path TO {self.schema}, public")
        return self

    def add_action(self, ref: str) -> int:
        """An action `pack.name` (the ref format the reference's CHECK enforces)."""
        pack_ref = ref.split(".", 1)[0]
        self.connection.execute(
            "INSERT INTO pack (ref, label) VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING",
            (pack_ref, pack_ref),
        )
        row = self.connection.execute(
            """INSERT INTO action (ref, pack, pack_ref, label, entrypoint)
               SELECT %s, id, ref, %s, 'run.py' FROM pack WHERE ref = %s RETURNING id""",
            (ref, ref, pack_ref),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def upsert_stats(self, action_id: int, **columns: Any) -> None:
        """The seed's upsert: every column of the row, last_updated NOW(); columns not given
        take the seed DDL's defaults (oldest_enqueued_at NULL)."""
        names = [
            c for c in seeds.attune_queue_stats_columns() if c not in ("action_id", "last_updated")
        ]
        unknown = set(columns) - set(names)
        assert not unknown, f"not columns of the seed's queue_stats: {unknown}"
        defaults = {"max_concurrent": 1, "oldest_enqueued_at": None}
        values = [columns.get(name, defaults.get(name, 0)) for name in names]
        self.connection.execute(
            f"""INSERT INTO queue_stats (action_id, {", ".join(names)}, last_updated)
                VALUES (%s, {", ".join(["%s"] * len(names))}, NOW())
                ON CONFLICT (action_id) DO UPDATE SET
                {", ".join(f"{name} = EXCLUDED.{name}" for name in names)},
                last_updated = NOW()""",
            (action_id, *values),
        )

    def set_last_updated(self, action_id: int, when: datetime) -> None:
        self.connection.execute(
            "UPDATE queue_stats SET last_updated = %s WHERE action_id = %s", (when, action_id)
        )

    def delete_stats(self, action_id: int) -> None:
        """The executor deletes an action's row when its queue empties."""
        self.connection.execute("DELETE FROM queue_stats WHERE action_id = %s", (action_id,))

    def delete_action(self, action_id: int) -> None:
        """The action goes; its queue_stats row with it (ON DELETE CASCADE, the seed's DDL)."""
        self.connection.execute(
            "UPDATE execution SET action = NULL WHERE action = %s", (action_id,)
        )
        self.connection.execute("DELETE FROM action WHERE id = %s", (action_id,))

    def add_executions(self, action_id: int, ref: str, status: str, count: int = 1) -> None:
        self.connection.execute(
            """INSERT INTO execution (action, action_ref, status)
               SELECT %s, %s, %s::execution_status_enum FROM generate_series(1, %s)""",
            (action_id, ref, status, count),
        )

    def set_status(self, action_id: int, old: str, new: str, count: int) -> None:
        self.connection.execute(
            """UPDATE execution SET status = %s::execution_status_enum
               WHERE id IN (SELECT id FROM execution WHERE action = %s AND status = %s
                            ORDER BY id LIMIT %s)""",
            (new, action_id, old, count),
        )

    def now(self) -> datetime:
        row = self.connection.execute("SELECT now()").fetchone()
        assert row is not None
        result: datetime = row[0]
        return result

    def close(self) -> None:
        self.connection.close()
