"""Faults against the real servers, each bounded in time (docs/operations.md states what they back).

- Redis restarted mid-stream: events emitted during the outage are all counted afterwards.
- The sidecar killed with SIGKILL at random points during ingestion, K times: every event is
  applied at least once, nothing is left pending, and the survivor's counters are exact.
- SIGTERM: the sidecar stops within 5 s and leaves nothing pending.
- PostgreSQL unavailable, then back, while events flow and the replica keeps the lease.
- Two replicas, the leader killed: sampling moves to the other within lease_ttl +
  renew_interval + two sample intervals.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exporter.lifecycle import wire
from exporter.lifecycle.producer import EventEmitter
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.sources.runner import SourceRunner
from exporter.sources.source import SourceReport
from tests.attune_db import Attune
from tests.conftest import (
    POSTGRES_ADMIN_DSN,
    parse_exposition,
    scrape,
    scrape_series,
    value,
    wait_for,
)
from tests.plain_source import PlainSource
from tests.private_redis import PrivateRedis, free_port
from tests.tcp_proxy import TcpProxy
from tests.timing import process_cost, time_until

STREAM = "chaos:events"
GROUP = "queue-exporter"
KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}


def _events_total(series: Any) -> float:
    return value(series, "queue_exporter_events_total", stream=STREAM) or 0.0


def _enqueued(series: Any, queue: str) -> float:
    return value(series, "queue_jobs_enqueued_total", queue=queue) or 0.0


def _series_when(scrape_now: Any, check: Any, timeout: float = 20.0) -> Any:
    """Scrape until check(series) holds; that scrape."""

    def attempt() -> Any:
        series = scrape_now()
        return series if check(series) else None

    return wait_for(attempt, timeout=timeout)


# -- a `queue-exporter serve` subprocess ----------------------------------------------------------


class Sidecar:
    def __init__(self, directory: Path, config: dict[str, Any], name: str) -> None:
        self.port = free_port()
        self.name = name
        config = {**config, "listen_address": f"127.0.0.1:{self.port}"}
        self.config_file = directory / f"{name}.yaml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.log_file = directory / f"{name}.log"
        env = {**os.environ, "POD_NAME": name}
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "exporter", "serve", "--config", str(self.config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def series(self) -> Any:
        return parse_exposition(scrape(self.port))

    def wait_serving(self) -> None:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_file.read_text()[-2000:]}")
            try:
                scrape(self.port, "/healthz")
            except (urllib.error.URLError, ConnectionError):
                return False
            return True

        wait_for(serving, timeout=30)

    def kill(self, signum: int = signal.SIGKILL) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_file.read_text()


@pytest.fixture
def sidecars(tmp_path):
    started: list[Sidecar] = []

    def start(config: dict[str, Any], name: str) -> Sidecar:
        sidecar = Sidecar(tmp_path, config, name)
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.kill()


def _events_config(url: str, **settings: Any) -> dict[str, Any]:
    return {
        "sources": {
            "events": {
                "streams": [{"key": STREAM, "system": "app", "start": "0"}],
                "redis": {"url": url, "socket_timeout": 2},
                "block_ms": 100,
                **settings,
            }
        }
    }


def _group(client: redis.Redis) -> dict[str, Any]:
    (group,) = [g for g in client.xinfo_groups(STREAM) if g["name"] == GROUP.encode()]
    return dict(group)


# -- Redis restarted mid-stream -------------------------------------------------------------------


def test_redis_restarted_mid_stream_counts_every_buffered_event(tmp_path, run_exporter):
    server = PrivateRedis(tmp_path).start()
    emitter = EventEmitter(server.url, STREAM, system="app", retry_interval=0.2)
    try:
        app = run_exporter(_events_config(server.url, claim_idle=1))
        for _ in range(300):
            emitter.emit("enqueued", queue="before")
        wait_for(lambda: _enqueued(scrape_series(app), "before") == 300, timeout=20)

        server.stop()  # no persistence: the stream and its group are gone with it
        for _ in range(500):
            emitter.emit("enqueued", queue="during")  # buffered by the producer
        wait_for(lambda: not app.health.snapshot()[f"events:{STREAM}"].up, timeout=20)
        server = PrivateRedis(tmp_path, port=server.port).start()

        series = _series_when(
            lambda: scrape_series(app), lambda s: _enqueued(s, "during") == 500, timeout=30
        )
        assert _enqueued(series, "before") == 300
        assert _events_total(series) == 800
        assert emitter.dropped == 0
        wait_for(lambda: server.client().xpending(STREAM, GROUP)["pending"] == 0)
    finally:
        emitter.close(timeout=1)
        server.stop()


# -- the sidecar killed during ingestion ----------------------------------------------------------


def _produce(client: redis.Redis, total: int, stop: threading.Event, pause: float = 0.04) -> None:
    """A steady producer: `total` events in small pipelined batches, `pause` s apart."""
    sent = 0
    entry = wire.encode("enqueued", {"queue": "q"})
    while sent < total and not stop.is_set():
        pipe = client.pipeline(transaction=False)
        for _ in range(min(200, total - sent)):
            pipe.xadd(STREAM, entry)  # type: ignore[arg-type]
        sent += len(pipe.execute())
        time.sleep(pause)


def test_sidecar_killed_repeatedly_applies_every_event_at_least_once(
    redis_client, redis_url, sidecars
):
    rng = random.Random(8)
    burst, steady, kills = 20_000, 10_000, 4
    total = kills * burst + steady
    redis_client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    config = _events_config(redis_url, claim_idle=1, batch_size=200)
    done = threading.Event()
    producer = threading.Thread(target=_produce, args=(redis_client, steady, done), daemon=True)
    producer.start()
    left_pending = []
    try:
        for round_ in range(kills):
            # A burst keeps the replica busy reading, so the kill lands between reads and acks.
            _produce(redis_client, burst, threading.Event(), pause=0)
            sidecar = sidecars(config, f"replica-{round_}")  # a new pod name each time
            sidecar.wait_serving()
            point = rng.randint(1, burst // 2)  # a random point during ingestion
            _series_when(sidecar.series, lambda s, point=point: _events_total(s) >= point)
            assert sidecar.kill() == -signal.SIGKILL
            left_pending.append(redis_client.xpending(STREAM, GROUP)["pending"])
        producer.join(timeout=60)
        assert not producer.is_alive()
    finally:
        done.set()
    assert redis_client.xlen(STREAM) == total
    assert any(left_pending), left_pending  # some kill left entries read but not acked

    # What the killed replicas left: entries read but never acked are pending, the rest unread.
    before = _group(redis_client)
    pending_before = redis_client.xpending(STREAM, GROUP)["pending"]
    unread = total - before["entries-read"]
    survivor = sidecars(config, "survivor")
    survivor.wait_serving()
    # Exact: the survivor applies each unread entry once and claims each pending one once.
    expected = unread + pending_before
    _series_when(survivor.series, lambda s: _events_total(s) >= expected, timeout=40)
    wait_for(lambda: redis_client.xpending(STREAM, GROUP)["pending"] == 0, timeout=20)
    # Nothing more arrives: a marker written after every entry is applied after all of them
    # (one consumer reads the stream in order), so once it is counted, the count is final.
    redis_client.xadd(STREAM, wire.encode("enqueued", {"queue": "marker"}))  # type: ignore[arg-type]
    series = _series_when(survivor.series, lambda s: _enqueued(s, "marker") == 1)
    assert _events_total(series) == expected + 1
    assert _enqueued(series, "q") == expected
    after = _group(redis_client)
    assert after["entries-read"] == total + 1 and after["lag"] == 0  # every entry, the marker
    # Every delivered entry is acked only after it was applied: all applied at least once.
    assert survivor.kill(signal.SIGTERM) == 0


# -- graceful shutdown ----------------------------------------------------------------------------


def test_sigterm_acks_what_was_applied_and_leaves_nothing_pending(
    redis_client, redis_url, sidecars
):
    redis_client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    config = _events_config(redis_url, claim_idle=60)  # nobody would claim for a minute
    config["leader_election"] = {"enabled": True, "lease_ttl": 30, "renew_interval": 1}
    config["sources"]["redis"] = {"url": redis_url, "key_groups": [KEY_GROUP]}
    sidecar = sidecars(config, "graceful")
    sidecar.wait_serving()
    done = threading.Event()
    producer = threading.Thread(target=_produce, args=(redis_client, 20_000, done), daemon=True)
    producer.start()
    wait_for(lambda: _events_total(sidecar.series()) > 2000, timeout=30)
    load = process_cost()  # what this machine's load adds to a process's stop, now
    started = time.monotonic()
    code = sidecar.kill(signal.SIGTERM)  # during ingestion
    stopped_in = time.monotonic() - started
    done.set()
    producer.join(timeout=10)
    assert code == 0, sidecar.log()
    assert stopped_in < 5 + load, (stopped_in, load)  # docs/operations.md "Shutdown"
    assert redis_client.get("queue-exporter:leader") is None  # released, not left to expire
    assert "released the lease" in sidecar.log()
    if redis_client.xpending(STREAM, GROUP)["pending"]:
        # Only a consumer starved past its grace (a busy machine) may leave its last read
        # pending, unapplied: it says so, and the same consumer name recovers it at restart.
        assert "into the shutdown, cut off" in sidecar.log()
        again = sidecars(config, "graceful")
        again.wait_serving()
        wait_for(lambda: redis_client.xpending(STREAM, GROUP)["pending"] == 0, timeout=30)


# -- PostgreSQL away and back ---------------------------------------------------------------------


def test_postgres_unavailable_then_back_while_events_flow(
    postgres_dsn, redis_client, redis_url, run_exporter
):
    attune = Attune(postgres_dsn).create_schema()
    action = attune.add_action("slack.post_message")
    attune.upsert_stats(action, queue_length=4, active_count=1, max_concurrent=2)
    target = conninfo_to_dict(POSTGRES_ADMIN_DSN)
    proxy = TcpProxy(str(target.get("host", "127.0.0.1")), int(target.get("port", 5432))).start()
    stats = "postgres:attune_queue_stats"
    try:
        config = _events_config(redis_url)
        config["sources"]["postgres"] = {"connect_timeout": 1}
        config["leader_election"] = {"enabled": True, "lease_ttl": 3, "renew_interval": 0.5}
        via_proxy = make_conninfo(postgres_dsn, host="127.0.0.1", port=proxy.port)
        app = run_exporter(config, postgres_dsn=via_proxy, preset=["attune"])
        depth = {"system": "attune", "queue": "slack.post_message", "state": "pending"}
        wait_for(lambda: value(scrape_series(app), "queue_depth", **depth) == 4)

        proxy.cut()
        for _ in range(50):
            redis_client.xadd(STREAM, wire.encode("enqueued", {"queue": "q"}))
        series = _series_when(
            lambda: scrape_series(app),
            lambda s: (
                value(s, "queue_exporter_source_up", source=stats) == 0 and _events_total(s) == 50
            ),
        )
        assert value(series, "queue_depth", **depth) is None  # withdrawn, not stale
        assert value(series, "queue_exporter_leader") == 1  # a failing source keeps the lease

        attune.upsert_stats(action, queue_length=9, active_count=1, max_concurrent=2)
        proxy.start()
        wait_for(lambda: value(scrape_series(app), "queue_depth", **depth) == 9, timeout=20)
    finally:
        proxy.cut()
        attune.close()


# -- two replicas, the leader killed --------------------------------------------------------------


def test_leader_killed_sampling_moves_within_the_takeover_bound(redis_client, redis_url, sidecars):
    redis_client.rpush("jobs:emails", "a", "b", "c")
    ttl, renew_interval, sample_interval = 2.0, 0.3, 0.5
    config = {
        "sample_interval": sample_interval,
        "sources": {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}},
        "leader_election": {"enabled": True, "lease_ttl": ttl, "renew_interval": renew_interval},
    }
    replicas = [sidecars(config, "replica-a"), sidecars(config, "replica-b")]
    for replica in replicas:
        replica.wait_serving()

    def roles() -> tuple[Sidecar, Sidecar] | None:
        leaders = [r for r in replicas if value(r.series(), "queue_exporter_leader") == 1]
        followers = [r for r in replicas if value(r.series(), "queue_exporter_leader") == 0]
        if len(leaders) == 1 and len(followers) == 1:
            return leaders[0], followers[0]
        return None

    leader, follower = wait_for(roles, timeout=20)
    wait_for(lambda: value(leader.series(), "queue_depth", queue="emails") == 3)
    # The reference: how long a change takes to be served by a sampling replica now (its next
    # cycle, the cycle, a scrape), the worst of three; a takeover ends with the same steps.
    served_in = 0.0
    for length in (4, 5, 6):
        redis_client.rpush("jobs:emails", "d")
        served_in = max(
            served_in,
            time_until(lambda n=length: value(leader.series(), "queue_depth", queue="emails") == n),
        )
    redis_client.ltrim("jobs:emails", 0, 2)
    wait_for(lambda: value(leader.series(), "queue_depth", queue="emails") == 3)
    assert value(follower.series(), "queue_depth", queue="emails") is None
    assert scrape(follower.port, "/readyz")  # 200: standing by is ready

    leader.kill()  # no release: the follower waits for the lease to expire
    killed_at = time.monotonic()
    wait_for(
        lambda: value(follower.series(), "queue_depth", queue="emails") == 3,
        timeout=20,
        interval=0.02,
    )
    moved_in = time.monotonic() - killed_at
    assert value(follower.series(), "queue_exporter_leader") == 1
    holder = redis_client.get("queue-exporter:leader").decode()
    assert holder.startswith(f"2:{follower.name}/")  # a new lease, fencing token 2
    # docs/operations.md: the lease expires, a follower's next attempt takes it, its sampler
    # notices within an interval and its cycle ends within another: on this machine now, the
    # second interval is what a change took to be served (served_in), when that was longer.
    bound = ttl + renew_interval + sample_interval + max(sample_interval, served_in)
    assert moved_in < bound, (moved_in, served_in)


# -- a slow backend: cycles that overrun are skipped, never piled up ------------------------------


class _SlowSource(PlainSource):
    name = "slow"
    interval = 0.1

    def __init__(self) -> None:
        self.cycles: list[tuple[float, float]] = []
        self.active = 0
        self.most_active = 0

    def sample(self) -> SourceReport:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        started = time.monotonic()
        time.sleep(0.25 if len(self.cycles) < 3 else 0.01)  # three cycles overrun the interval
        self.cycles.append((started, time.monotonic()))
        self.active -= 1
        return SourceReport()


class _StopRecordingWaits(threading.Event):
    """The runner's stop event, recording each wait the runner asks of it: its own schedule,
    read as it decided it. Start times seen inside sample() are not: on a loaded machine the
    runner's set-up before each sample() (deadline watchdog, leadership) takes a varying share
    of the interval, and one slow set-up followed by a quick one made two starts look closer
    than an interval with no cycle made up for."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.waits.append(timeout)
        return super().wait(timeout)


def test_overrunning_cycles_are_skipped_not_piled_up():
    source, stop = _SlowSource(), _StopRecordingWaits()
    telemetry = Telemetry(HealthBoard())
    runner = SourceRunner(source, telemetry, stop)
    runner.start()
    wait_for(lambda: len(source.cycles) >= 8, timeout=20)
    stop.set()
    runner.thread.join(timeout=10)
    telemetry.shutdown()
    assert source.most_active == 1  # one cycle at a time
    starts = [started for started, _ in source.cycles]
    assert all(start >= end for start, (_, end) in zip(starts[1:], source.cycles, strict=False))
    # Every cycle is followed by a wait, none of them empty: never a burst of make-up cycles
    # back to back. Each wait ends at the next interval boundary: shorter than an interval
    # (an overrun of 0.25 s at a 0.1 s interval leaves about 0.05 s), never a whole one.
    assert len(stop.waits) == len(source.cycles), (stop.waits, source.cycles)
    assert all(0 < wait < source.interval for wait in stop.waits), stop.waits
