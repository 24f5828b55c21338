"""Attune's executor, as far as the exporter sees it: executions moving through their
statuses and one queue_stats row per action upserted on every queue change.

`aws.ec2_start` runs at its concurrency limit with a growing backlog; `linux.backup`'s row is
written once and never again (a stuck executor), so its statistics age keeps growing.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from exporter.demo.attune_db import Attune
from exporter.demo.dice import Dice

SCHEMA = "attune"
FINISHED_KEEP = timedelta(minutes=5)
STALE_ACTION = "linux.backup"

# What goes wrong on purpose, for the banner.
STAGED_FAULTS = (
    "Attune's aws.ec2_start runs at its concurrency limit with a growing backlog",
    f"Attune's {STALE_ACTION} statistics row is never updated: its age grows (QueueStatsStale)",
)


@dataclass(frozen=True)
class Action:
    ref: str
    share: float
    max_concurrent: int
    mean_seconds: float


ACTIONS = (
    Action("slack.post_message", 0.5, 4, 0.5),
    Action("core.http_request", 0.4, 8, 0.8),
    Action("aws.ec2_start", 0.1, 2, 6.0),
)
ENDINGS = {"completed": 0.92, "failed": 0.06, "timeout": 0.02}


@dataclass
class ActionState:
    action: Action
    action_id: int
    waiting: deque[tuple[int, float]] = field(default_factory=deque)  # (execution id, created)
    requested: list[int] = field(default_factory=list)
    running: list[tuple[int, float]] = field(default_factory=list)  # (id, finish time)
    total_enqueued: int = 0
    total_completed: int = 0
    changed: bool = False


class AttuneSim:
    def __init__(self, dsn: str, rate: float, seed: int) -> None:
        self.db = Attune(dsn, SCHEMA)
        self.rate = rate
        self.dice = Dice(seed)
        self.states: list[ActionState] = []
        self._ids = itertools.count(1)
        self._next_cleanup = 0.0

    def prepare(self) -> None:
        self.db.create_schema()
        for action in ACTIONS:
            self.states.append(ActionState(action, self.db.add_action(action.ref)))
        stale = self.db.add_action(STALE_ACTION)
        self.db.add_executions(stale, STALE_ACTION, "requested", 3)
        now = self.db.now()
        self.db.upsert_stats(
            stale,
            queue_length=3,
            max_concurrent=1,
            oldest_enqueued_at=now - timedelta(minutes=15),
            total_enqueued=41,
            total_completed=38,
        )
        self.db.set_last_updated(stale, now - timedelta(minutes=5))

    def tick(self, now: float, dt: float) -> None:
        for state in self.states:
            self._arrivals(state, now, dt)
            self._finish(state, now)
            self._schedule(state)
            self._start(state, now)
            if state.changed:
                self._write_stats(state)
        if now >= self._next_cleanup:  # retention: finished executions do not pile up
            self.db.connection.execute(
                "DELETE FROM execution WHERE status IN ('completed', 'failed', 'timeout', "
                "'cancelled') AND updated < %s",
                (datetime.now(UTC) - FINISHED_KEEP,),
            )
            self._next_cleanup = now + 30.0

    def _arrivals(self, state: ActionState, now: float, dt: float) -> None:
        count = self.dice.poisson(self.rate * state.action.share * dt)
        if not count:
            return
        rows = self.db.connection.execute(
            """INSERT INTO execution (action, action_ref, status)
               SELECT %s, %s, 'requested' FROM generate_series(1, %s) RETURNING id""",
            (state.action_id, state.action.ref, count),
        ).fetchall()
        state.requested.extend(int(row[0]) for row in rows)
        state.total_enqueued += count
        state.changed = True

    def _schedule(self, state: ActionState) -> None:
        """requested -> scheduled: the executor queues them behind the concurrency limit."""
        if state.requested:
            self._set_status(state.requested, "scheduled")
            created = datetime.now(UTC).timestamp()
            state.waiting.extend((execution, created) for execution in state.requested)
            state.requested = []

    def _start(self, state: ActionState, now: float) -> None:
        starting: list[int] = []
        while state.waiting and len(state.running) < state.action.max_concurrent:
            execution, _ = state.waiting.popleft()
            starting.append(execution)
            state.running.append((execution, now + self.dice.duration(state.action.mean_seconds)))
        if starting:
            self._set_status(starting, "running")
            state.changed = True

    def _finish(self, state: ActionState, now: float) -> None:
        done = [item for item in state.running if item[1] <= now]
        if not done:
            return
        state.running = [item for item in state.running if item[1] > now]
        by_status: dict[str, list[int]] = {}
        for execution, _ in done:
            by_status.setdefault(self.dice.weighted(ENDINGS), []).append(execution)
        for status, executions in by_status.items():
            self._set_status(executions, status)
        state.total_completed += len(done)
        state.changed = True

    def _write_stats(self, state: ActionState) -> None:
        state.changed = False
        if not state.waiting and not state.running:
            self.db.delete_stats(state.action_id)  # Attune deletes the row of an empty queue
            return
        oldest = datetime.fromtimestamp(state.waiting[0][1], UTC) if state.waiting else None
        self.db.upsert_stats(
            state.action_id,
            queue_length=len(state.waiting),
            active_count=len(state.running),
            max_concurrent=state.action.max_concurrent,
            oldest_enqueued_at=oldest,
            total_enqueued=state.total_enqueued,
            total_completed=state.total_completed,
        )

    def _set_status(self, executions: list[int], status: str) -> None:
        self.db.connection.execute(
            "UPDATE execution SET status = %s::execution_status_enum, updated = NOW() "
            "WHERE id = ANY(%s)",
            (status, executions),
        )

    def depth(self) -> int:
        return sum(len(state.waiting) for state in self.states)

    def drop(self) -> None:
        self.db.connection.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')

    def close(self) -> None:
        self.db.close()
