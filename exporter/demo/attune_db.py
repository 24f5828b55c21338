"""Attune's tables as its migrations define them, and writes made the way Attune makes them.

Only the tables the preset reads (and what they reference) are created: pack (reduced to the
columns action needs), action with its ref CHECK constraints, execution with the
execution_status_enum and its indexes, queue_stats with its index. The executor upserts one
queue_stats row per action on every queue change and deletes it when the queue empties.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

STATUSES = (
    "requested",
    "scheduling",
    "scheduled",
    "running",
    "completed",
    "failed",
    "canceling",
    "cancelled",
    "timeout",
    "abandoned",
)
UNFINISHED = ("requested", "scheduling", "scheduled", "running", "canceling")


def schema_ddl(schema: str = "attune") -> str:
    statuses = ", ".join(f"'{status}'" for status in STATUSES)
    return f"""
CREATE SCHEMA IF NOT EXISTS {schema};
SET search_path TO {schema}, public;
CREATE TYPE execution_status_enum AS ENUM ({statuses});
CREATE TABLE pack (
    id BIGSERIAL PRIMARY KEY,
    ref TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL,
    created TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE TABLE action (
    id BIGSERIAL PRIMARY KEY,
    ref TEXT NOT NULL UNIQUE,
    pack BIGINT NOT NULL REFERENCES pack(id) ON DELETE CASCADE,
    pack_ref TEXT NOT NULL,
    label TEXT NOT NULL,
    description TEXT NOT NULL,
    entrypoint TEXT NOT NULL,
    param_schema JSONB,
    out_schema JSONB,
    created TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    CONSTRAINT action_ref_lowercase CHECK (ref = LOWER(ref)),
    CONSTRAINT action_ref_format CHECK (ref ~ '^[^.]+\\.[^.]+$')
);
CREATE TABLE execution (
    id BIGSERIAL PRIMARY KEY,
    action BIGINT REFERENCES action(id),
    action_ref TEXT NOT NULL,
    config JSONB,
    parent BIGINT REFERENCES execution(id),
    status execution_status_enum NOT NULL DEFAULT 'requested',
    result JSONB,
    created TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    is_workflow BOOLEAN DEFAULT false NOT NULL,
    updated TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX idx_execution_action ON execution(action);
CREATE INDEX idx_execution_action_ref ON execution(action_ref);
CREATE INDEX idx_execution_status ON execution(status);
CREATE INDEX idx_execution_created ON execution(created DESC);
CREATE INDEX idx_execution_status_created ON execution(status, created DESC);
CREATE INDEX idx_execution_action_status ON execution(action, status);
CREATE TABLE queue_stats (
    action_id BIGINT PRIMARY KEY REFERENCES action(id) ON DELETE CASCADE,
    queue_length INTEGER NOT NULL DEFAULT 0,
    active_count INTEGER NOT NULL DEFAULT 0,
    max_concurrent INTEGER NOT NULL DEFAULT 1,
    oldest_enqueued_at TIMESTAMPTZ,
    total_enqueued BIGINT NOT NULL DEFAULT 0,
    total_completed BIGINT NOT NULL DEFAULT 0,
    last_updated TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX idx_queue_stats_last_updated ON queue_stats(last_updated);
RESET search_path;
"""


class Attune:
    """An Attune database driven the way its executor and API write it."""

    def __init__(self, dsn: str, schema: str = "attune") -> None:
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.schema = schema
        self.connection.execute(f"SET search_path TO {schema}, public")

    def create_schema(self) -> Attune:
        self.connection.execute(schema_ddl(self.schema))
        self.connection.execute(f"SET search_path TO {self.schema}, public")
        self.connection.execute("INSERT INTO pack (ref, label) VALUES ('core', 'Core')")
        return self

    def add_action(self, ref: str) -> int:
        pack_ref = ref.split(".", 1)[0]
        self.connection.execute(
            "INSERT INTO pack (ref, label) VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING",
            (pack_ref, pack_ref),
        )
        row = self.connection.execute(
            """INSERT INTO action (ref, pack, pack_ref, label, description, entrypoint)
               SELECT %s, id, ref, %s, '', 'run.py' FROM pack WHERE ref = %s RETURNING id""",
            (ref, ref, pack_ref),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def upsert_stats(self, action_id: int, **columns: Any) -> None:
        """QueueStatsRepository::upsert: INSERT ... ON CONFLICT DO UPDATE, last_updated NOW()."""
        values = {
            "queue_length": 0,
            "active_count": 0,
            "max_concurrent": 1,
            "oldest_enqueued_at": None,
            "total_enqueued": 0,
            "total_completed": 0,
            **columns,
        }
        names = list(values)
        self.connection.execute(
            f"""INSERT INTO queue_stats (action_id, {", ".join(names)}, last_updated)
                VALUES (%s, {", ".join(["%s"] * len(names))}, NOW())
                ON CONFLICT (action_id) DO UPDATE SET
                {", ".join(f"{name} = EXCLUDED.{name}" for name in names)},
                last_updated = NOW()""",
            (action_id, *values.values()),
        )

    def set_last_updated(self, action_id: int, when: datetime) -> None:
        self.connection.execute(
            "UPDATE queue_stats SET last_updated = %s WHERE action_id = %s", (when, action_id)
        )

    def delete_stats(self, action_id: int) -> None:
        self.connection.execute("DELETE FROM queue_stats WHERE action_id = %s", (action_id,))

    def delete_action(self, action_id: int) -> None:
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
