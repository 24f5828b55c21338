"""Celery's events across reads that fail: a read cut off at its deadline (by the watchdog
while it waits on a hung Redis, or on CPU) keeps its subscription, so every event Celery
publishes meanwhile is counted by the next read; a subscription lost with its connection is a
gap, counted in queue_exporter_events_lost_total and named in the log. Real Redis, events sent
by Celery's own EventDispatcher."""

from __future__ import annotations

import json
import logging
import time
import uuid
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterator
from contextlib import suppress

import pytest
import redis
from celery import Celery

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from exporter.lifecycle.metrics import EventMetrics
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import CeleryReaderConfig
from exporter.sources.readers.framework import NativeSource, ReadDeadline, ReaderError, Signals
from exporter.sources.source import DeadlineExceeded, sample_within_deadline
from exporter.sources.streams.config import EventsSourceConfig
from tests.applied_source import AppliedSource
from tests.conftest import REDIS_HOST, REDIS_PORT, parse_exposition, total, value, wait_for
from tests.private_redis import PrivateRedis
from tests.tcp_proxy import TcpProxy

EVENTS = 20  # task-succeeded events per batch
INTERVAL = 2.0  # the reads' interval, and so their deadline


def _publish(redis_url: str, count: int) -> None:
    """`count` task-succeeded events, as a worker sends them (straight to Redis)."""
    celery = Celery(broker=redis_url)
    with celery.connection_for_write() as connection:
        dispatcher = celery.events.Dispatcher(connection, hostname="w@test")
        for _ in range(count):
            dispatcher.send("task-succeeded", uuid=str(uuid.uuid4()), runtime=0.01)
        dispatcher.close()


def _heard(redis_url: str, read: Callable[[], float]) -> None:
    """Read until the reader hears a heartbeat (`read` gives the events it consumed so far):
    it is subscribed, events published from now on are heard. Heartbeats count no task."""

    def heard() -> bool:
        celery = Celery(broker=redis_url)
        with celery.connection_for_write() as connection:
            dispatcher = celery.events.Dispatcher(connection, hostname="w@test")
            dispatcher.send("worker-heartbeat", active=0, freq=2.0)
            dispatcher.close()
        return read() > 0

    wait_for(heard, timeout=30)


class _Feed:
    """A Celery reader run as the exporter runs it: under its deadline's watchdog."""

    def __init__(self, url: str) -> None:
        connection = RedisConnectionConfig(url=url)
        self.telemetry = Telemetry(HealthBoard())
        metrics = EventMetrics(self.telemetry, EventsSourceConfig().buckets())
        reader = CeleryReaderConfig()
        source = NativeSource(lambda: CeleryReader(reader, connection, INTERVAL), INTERVAL, metrics)
        self.source = AppliedSource(source, self.telemetry, metrics)

    def read(self) -> None:
        sample_within_deadline(self.source)

    def counted(self) -> tuple[float, float]:
        """(tasks completed, events lost) as the exporter serves them."""
        series = parse_exposition(self.telemetry.render(False).decode())
        completed = total(series, "queue_jobs_completed_total", system="celery")
        lost = value(series, "queue_exporter_events_lost_total", stream="native:celery")
        return completed, lost or 0.0

    def consumed(self) -> float:
        """Events read so far (a read first; one cut off on a loaded host is tried again)."""
        try:
            self.read()
        except DeadlineExceeded:
            return 0.0
        series = parse_exposition(self.telemetry.render(False).decode())
        return value(series, "queue_exporter_events_total", stream="native:celery") or 0.0

    def read_until(self, completed: float) -> tuple[float, float]:
        """Read (a failed read is tried again) until `completed` tasks are counted."""

        def enough() -> tuple[float, float] | None:
            try:
                self.read()
            except Exception:
                return None
            counted = self.counted()
            return counted if counted[0] >= completed else None

        return wait_for(enough, timeout=30)

    def close(self) -> None:
        self.source.close()
        self.telemetry.shutdown()


@pytest.fixture
def proxied(redis_url: str) -> Iterator[tuple[TcpProxy, _Feed]]:
    """A feed reading the test's database through a proxy of its own (frozen or cut by the
    test), subscribed: what Celery publishes from now on is heard."""
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    database = redis_url.rsplit("/", 1)[1]
    feed = _Feed(f"redis://127.0.0.1:{proxy.port}/{database}")
    try:
        _heard(redis_url, feed.consumed)
        yield proxy, feed
    finally:
        feed.close()
        proxy.cut()


def test_a_read_cut_off_by_the_watchdog_keeps_its_subscription(redis_url, proxied):
    """The reader reads through a proxy that freezes (a hung Redis): its read is cut off by the
    watchdog; what Celery publishes during that read and after it is counted by the next read,
    none lost. (It was lost: the cut-off read dropped the subscription, made again at the next
    read.)"""
    proxy, feed = proxied
    before, _ = feed.counted()
    proxy.freeze()
    _publish(redis_url, EVENTS)  # during the read cut off below
    with pytest.raises(DeadlineExceeded):
        feed.read()
    _publish(redis_url, EVENTS)  # between the cut-off read and the next
    proxy.thaw()
    completed, lost = feed.read_until(before + 2 * EVENTS)
    assert (completed - before, lost) == (2 * EVENTS, 0)


def test_a_read_past_its_cpu_deadline_keeps_its_subscription(redis_url):
    """A read that has spent its deadline stops and fails as `timeout`; the events waiting then,
    and those published before the next read, are counted by the next read."""
    reader = CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=redis_url), INTERVAL)
    completed = consumed = 0.0

    def read() -> float:
        """Tasks completed in one read."""
        nonlocal consumed
        signals = Signals()
        reader.read(signals)
        assert signals.tally.lost == 0
        consumed += signals.tally.consumed
        counts = signals.tally.counts.items()
        return sum(n for (name, _), n in counts if name == "queue_jobs_completed_total")

    def read_consumed() -> float:
        read()
        return consumed

    try:
        _heard(redis_url, read_consumed)
        _publish(redis_url, EVENTS)  # waiting when the read below is stopped
        with pytest.raises(ReaderError) as stopped:
            reader.read(Signals(deadline=ReadDeadline(wall=0.0, cpu=0.0)))
        assert stopped.value.reason == "timeout"
        _publish(redis_url, EVENTS)  # between the stopped read and the next

        def all_counted() -> bool:
            nonlocal completed
            completed += read()
            return completed >= 2 * EVENTS

        wait_for(all_counted, timeout=30)
        assert completed == 2 * EVENTS
    finally:
        reader.close()


def test_a_lost_subscription_is_a_gap_counted_and_named(redis_url, proxied, caplog):
    """The subscription's connection breaks (the proxy cuts every connection): events published
    then are not seen; the subscription is made again, the gap is counted once in
    queue_exporter_events_lost_total and named in the log, and what comes after is counted."""
    proxy, feed = proxied
    before, _ = feed.counted()
    proxy.cut()
    _publish(redis_url, EVENTS)  # no one subscribed: lost
    proxy.start()

    def gap_counted() -> bool:
        try:
            feed.read()
        except Exception:
            return False  # the connections broken by the cut: the next read connects again
        return feed.counted()[1] > 0

    with caplog.at_level(logging.WARNING):
        wait_for(gap_counted, timeout=30)
    assert "[resubscribed]" in caplog.text
    _publish(redis_url, EVENTS)  # subscribed again: heard
    completed, lost = feed.read_until(before + EVENTS)
    assert (completed - before, lost) == (EVENTS, 1)


def test_worker_offline_removes_the_worker_at_once(redis_url):
    """A worker that stops cleanly says so (worker-offline): it leaves queue_workers at the
    read that hears it, not at its timeout. Without inspection (no worker here answers) a
    worker is known from its heartbeats, under "(unknown)" and with no slot series."""
    connection = RedisConnectionConfig(url=redis_url)
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, EventsSourceConfig().buckets())
    reader = CeleryReaderConfig(inspect=False, events_timeout=600)
    native = NativeSource(lambda: CeleryReader(reader, connection, 600), 600, metrics)
    source = AppliedSource(native, telemetry, metrics)

    def workers() -> float | None:
        source.sample()
        series = parse_exposition(telemetry.render(False).decode())
        assert not [name for name, _ in series if name == "queue_worker_slots"]
        return total(series, "queue_workers", system="celery", queue="(unknown)")

    def send(kind: str) -> None:
        celery = Celery(broker=redis_url)
        with celery.connection_for_write() as connection:
            dispatcher = celery.events.Dispatcher(connection, hostname="w@offline")
            dispatcher.send(kind, active=0, freq=2.0)
            dispatcher.close()

    try:
        source.sample()  # subscribed from here on

        def heartbeat_heard() -> bool:
            send("worker-heartbeat")
            return workers() == 1

        wait_for(heartbeat_heard, timeout=30)
        send("worker-offline")
        wait_for(lambda: workers() == 0, timeout=30)
    finally:
        source.close()
        telemetry.shutdown()


@pytest.mark.parametrize("granted", [True, False], ids=["redis-acl-rules", "read-only-rules"])
def test_an_inspection_the_acl_refuses_costs_its_figures_alone(granted, tmp_path):
    """Under the ACL redis-acl prints for the celery preset, an inspection round runs (no
    caveat); under the rules of `inspect: false` (no write granted) the round is refused: the
    read succeeds all the same and says why on the status page (its caveat)."""
    server = PrivateRedis(tmp_path).start()
    try:
        native = {"celery": {"inspect": granted}}
        config = config_module.from_dict({"presets": ["celery"], "sources": {"native": native}})
        rules = redis_acl.acl_rules(config)
        admin = server.client()
        admin.execute_command("ACL", "SETUSER", "qe", "reset", "on", ">pw", *rules)
        url = f"redis://qe:pw@127.0.0.1:{server.port}/0"
        reader = CeleryReader(CeleryReaderConfig(), RedisConnectionConfig(url=url), INTERVAL)
        try:
            signals = Signals()
            reader.read(signals)
        finally:
            reader.close()
        if granted:
            assert signals.caveat is None
            assert not admin.exists("_kombu.binding.reply.celery.pidbox")  # left as it was
        else:
            assert signals.caveat is not None and "inspection was refused" in signals.caveat
            assert "NOPERM" in signals.caveat or "NoPermission" in signals.caveat
    finally:
        server.stop()


def test_a_retry_reported_after_the_next_attempt_ended_counts_on_its_queue(redis_url):
    """A prefork pool of two processes: one runs the retried attempt while the main process
    has not yet taken the other's result, so task-retried comes after the next attempt's
    task-succeeded (seen with real workers, tests/conformance/adapters/celery.py). The retry
    counts on the task's queue with its name, not under "(unknown)" with none."""
    feed = _Feed(redis_url)
    try:
        _heard(redis_url, feed.consumed)
        celery = Celery(broker=redis_url)
        task = {"uuid": str(uuid.uuid4())}
        with celery.connection_for_write() as connection:
            dispatcher = celery.events.Dispatcher(connection, hostname="w@test")
            dispatcher.send("task-sent", name="tests.to_emails", queue="emails", **task)
            for retries in (0, 1):
                dispatcher.send("task-received", name="tests.to_emails", retries=retries, **task)
                dispatcher.send("task-started", **task)
            dispatcher.send("task-succeeded", runtime=0.01, **task)
            dispatcher.send("task-retried", exception="Retry('retrying')", **task)
            dispatcher.close()

        def retried() -> dict[str, float] | None:
            feed.read()
            series = parse_exposition(feed.telemetry.render(False).decode())
            found: dict[str, float] = {}
            for (name, labels), count in series.items():
                if name == "queue_jobs_retried_total":
                    found[f"{dict(labels)['queue']} {dict(labels)['job_type']}"] = count
            return found or None

        assert wait_for(retried, timeout=30) == {"emails tests.to_emails": 1}
        assert feed.counted() == (1, 0)
    finally:
        feed.close()


FLOOD = 300_000
FLOOD_PIPELINE = 10_000  # PUBLISHes sent per round trip


def _flood(redis_url: str, count: int) -> list[tuple[bytes, bytes]]:
    """`count` task-succeeded events as Celery's worker publishes them: the kombu message its
    EventDispatcher sends (heard on the events channel), one per task id."""
    listener = RedisConnectionConfig(url=redis_url).connect().pubsub()
    listener.psubscribe(CeleryReaderConfig().channel_pattern(RedisConnectionConfig(url=redis_url)))
    try:
        wait_for(lambda: (listener.get_message(timeout=0.1) or {}).get("type") == "psubscribe")
        _publish(redis_url, 1)
        sent = wait_for(lambda: listener.get_message(timeout=0.1))
    finally:
        listener.close()
    envelope = json.loads(sent["data"])
    event = json.loads(b64decode(envelope["body"]))
    assert (event["type"], envelope["properties"]["body_encoding"]) == ("task-succeeded", "base64")
    messages = []
    for index in range(count):
        body = json.dumps({**event, "uuid": f"flood-{index}"}).encode()
        message = {**envelope, "body": b64encode(body).decode()}
        messages.append((sent["channel"], json.dumps(message).encode()))
    return messages


def _subscriber(client: redis.Redis) -> str | None:
    """The id of the (only) pattern subscriber's connection."""
    found = [entry["id"] for entry in client.client_list() if entry.get("psub") == "1"]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_flood_of_300k_events_is_counted_or_its_gap_is(tmp_path, caplog):
    """300,000 task-succeeded events published within about a second (Celery's own message,
    one per task id, PUBLISHed in pipelines) between two reads of a subscribed reader, on a
    private Redis with its default output buffer limit for subscribers (32 MB hard): every
    event is counted once, or Redis cut the subscriber off (its connection is another after
    the reads) and each such gap is counted in queue_exporter_events_lost_total and named;
    nothing is counted twice."""
    server = PrivateRedis(tmp_path).start()
    feed = _Feed(server.url)
    admin = server.client()
    try:
        _heard(server.url, feed.consumed)
        subscriber = _subscriber(admin)
        messages = _flood(server.url, FLOOD)
        before, _ = feed.counted()
        started = time.monotonic()
        for first in range(0, FLOOD, FLOOD_PIPELINE):
            pipe = admin.pipeline(transaction=False)
            for channel, data in messages[first : first + FLOOD_PIPELINE]:
                pipe.publish(channel, data)
            pipe.execute()
        took = time.monotonic() - started
        counted: list[float] = []
        caplog.set_level(logging.WARNING)
        while len(counted) < 3 or counted[-3:] != [counted[-1]] * 3:  # until none comes
            assert len(counted) < 200, counted
            with suppress(Exception):  # a read cut off: the next one reads on
                feed.read()
            counted.append(feed.counted()[0] - before)
        completed, lost = feed.counted()
        completed -= before
        cut_off = _subscriber(admin) != subscriber
        print(
            f"{FLOOD} events published in {took:.2f} s ({len(messages[0][1])} B each): counted "
            f"{completed:.0f} in {len(counted)} reads, gaps counted {lost:.0f}, the subscriber "
            f"{'cut off' if cut_off else 'kept'}"
        )
        assert completed <= FLOOD
        if cut_off:
            assert lost >= 1 and "[resubscribed]" in caplog.text
        else:
            assert (completed, lost) == (FLOOD, 0)
    finally:
        feed.close()
        server.stop()
