"""The demo's synthetic workload: the three seed systems and a legacy app, all at once.

`--rate` is the arrival rate (jobs per second) of Orchestrata and of Runner-Q each; Attune
gets half of it (its executions are PostgreSQL rows). `--seed` fixes every random choice, so
two runs of the same seed make the same decisions tick by tick.

On servers the demo did not start, it writes only under its own names and refuses to start
when they already hold data (it would otherwise mix with, and then delete, someone's queues);
remove_data() deletes exactly what it wrote.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
import redis

from exporter.demo import sim_attune, sim_legacy, sim_orchestrata, sim_runnerq
from exporter.lifecycle.producer import EventEmitter

log = logging.getLogger(__name__)

# What the workload stages on purpose (the banner lists them): the warnings and alerts they
# raise are the demo's, not a misconfiguration.
STAGED_FAULTS = (
    *sim_orchestrata.STAGED_FAULTS,
    *sim_runnerq.STAGED_FAULTS,
    *sim_attune.STAGED_FAULTS,
    *sim_legacy.STAGED_FAULTS,
)

TICK = 0.1
# Patterns of every Redis key the workload writes (activity hashes are tracked one by one).
OWN_KEY_PATTERNS = (
    f"{sim_orchestrata.PREFIX}:*",
    f"{sim_runnerq.QUEUE}:*",
    f"{sim_legacy.PREFIX}:*",
)


class WorkloadError(RuntimeError):
    """The workload cannot run against these servers; the message says why."""


class Workload:
    def __init__(self, redis_url: str, postgres_dsn: str, rate: float, seed: int) -> None:
        self.client = redis.Redis.from_url(redis_url, socket_timeout=5)
        self.emitter = EventEmitter(
            redis_url,
            sim_orchestrata.EVENTS_STREAM,
            system="orchestrata",
            maxlen=100_000,
            buffer_size=50_000,
        )
        self.orchestrata = sim_orchestrata.OrchestrataSim(self.client, self.emitter, rate, seed)
        self.runnerq = sim_runnerq.RunnerQSim(self.client, rate, seed + 1)
        self.legacy = sim_legacy.LegacySim(self.client, self.emitter, seed + 3)
        self.postgres_dsn = postgres_dsn
        self.attune: sim_attune.AttuneSim | None = None
        self.rate = rate
        self.seed = seed
        self.ticks = 0
        self.errors = 0
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Refuse servers that already hold data under the demo's names."""
        for pattern in (*OWN_KEY_PATTERNS, "activity:*"):
            for _ in self.client.scan_iter(match=pattern, count=1000):
                raise WorkloadError(
                    f"Redis already holds keys matching {pattern!r}: the demo writes there and "
                    "deletes what it wrote; give it an empty database (e.g. redis://HOST:6379/15)"
                )
        with psycopg.connect(self.postgres_dsn, autocommit=True) as connection:
            found = connection.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (sim_attune.SCHEMA,)
            ).fetchone()
        if found:
            raise WorkloadError(
                f"PostgreSQL already has a schema {sim_attune.SCHEMA!r}: give the demo a "
                "database without one (CREATE DATABASE queue_exporter_demo)"
            )

    def setup(self) -> None:
        """The initial state: Attune's schema and actions, the legacy tenants' lists, and what
        Orchestrata and Runner-Q left before the demo (a dead letter each)."""
        self.attune = sim_attune.AttuneSim(self.postgres_dsn, self.rate, self.seed + 2)
        self.attune.prepare()
        now = time.time()
        self.legacy.prepare(now)
        self.orchestrata.prepare(now)
        self.runnerq.prepare(now)

    def missing(self, globs: list[tuple[str, str]]) -> list[str]:
        """The names of (name, SCAN glob) pairs no key matches yet."""
        return [
            name
            for name, glob in globs
            if next(iter(self.client.scan_iter(match=glob, count=1000)), None) is None
        ]

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="demo-workload")
        self._thread.start()

    def run(self, stop: threading.Event) -> None:
        steps: list[Callable[[float, float], None]] = [
            self.orchestrata.tick,
            self.runnerq.tick,
            self.legacy.tick,
        ]
        if self.attune is not None:
            steps.append(self.attune.tick)
        next_tick = time.monotonic()
        previous = next_tick - TICK  # the first tick's arrivals: one TICK's
        while not stop.is_set():
            now = time.time()
            # Arrivals over the time since the last tick, not a fixed TICK: workers finish by
            # the clock, so on a host too busy to tick every TICK a fixed step cut the arrival
            # rate alone and the under-provisioned backlogs drained (their keys went)
            started = time.monotonic()
            dt, previous = started - previous, started
            for step in steps:
                try:
                    step(now, dt)
                except (redis.RedisError, psycopg.Error) as error:
                    # A server restarting or a network blip: this tick's writes of that
                    # system are lost, the simulation goes on.
                    self.errors += 1
                    if self.errors == 1 or self.errors % 100 == 0:
                        log.warning("workload: %s (%d errors so far)", error, self.errors)
            self.ticks += 1
            next_tick = max(next_tick + TICK, time.monotonic())  # late: no catching up
            stop.wait(max(0.0, next_tick - time.monotonic()))

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def stop_events(self) -> None:
        """Send what the emitter still holds, then stop it."""
        self.emitter.close(timeout=2.0)

    def close(self) -> None:
        self.emitter.close(timeout=0.1)  # no-op once stop_events() ran
        if self.attune is not None:
            self.attune.close()
        self.client.close()

    def remove_data(self, redis: bool = True, postgres: bool = True) -> None:
        """Delete everything the workload wrote (on servers the demo did not start)."""
        if redis:
            self._remove_keys()
        if postgres:
            with psycopg.connect(self.postgres_dsn, autocommit=True) as connection:
                connection.execute(f'DROP SCHEMA IF EXISTS "{sim_attune.SCHEMA}" CASCADE')

    def _remove_keys(self) -> None:
        streams = [sim_orchestrata.EVENTS_STREAM, f"{sim_runnerq.QUEUE}:events_stream"]
        for pattern in OWN_KEY_PATTERNS:
            batch = list(self.client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(batch), 1000):
                self.client.unlink(*batch[start : start + 1000])
        ids = [f"activity:{activity_id}" for activity_id in self.runnerq.activity_ids]
        for start in range(0, len(ids), 1000):
            self.client.unlink(*ids[start : start + 1000])
        self.client.unlink(*streams)

    def depth(self) -> int:
        total = self.orchestrata.depth() + self.runnerq.depth()
        return total + (self.attune.depth() if self.attune is not None else 0)
