"""Hung backends: Redis and PostgreSQL frozen behind a real TCP proxy (sockets open, nothing
forwarded, so only the exporter's own clock can notice).

A frozen backend's source is marked down with reason `timeout`, its series are withdrawn
within two intervals, /readyz turns 503, the reason is logged, and the source comes back by
itself once the backend answers again. SIGTERM ends `queue-exporter serve` within 5 s while
both backends are frozen mid-cycle.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exporter.config.settings import from_dict
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet
from exporter.output.telemetry import Telemetry
from exporter.runtime.build import build
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.runner import SourceRunner
from exporter.sources.watchdog import Watchdog
from tests.conftest import (
    POSTGRES_ADMIN_DSN,
    REDIS_HOST,
    REDIS_PORT,
    Series,
    is_ready,
    parse_exposition,
    scrape,
    scrape_series,
    total,
    value,
    wait_for,
)
from tests.tcp_proxy import TcpProxy
from tests.timing import process_cost, wake_up_lag

KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
COLLECTOR = {
    "name": "backlog",
    "query": "SELECT 'emails' AS queue, 4::int AS waiting",
    "labels": ["queue"],
    "values": [{"column": "waiting", "metric": "app_backlog"}],
}


@pytest.fixture
def redis_proxy():
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    yield proxy
    proxy.cut()


@pytest.fixture
def postgres_proxy():
    target = conninfo_to_dict(POSTGRES_ADMIN_DSN)
    proxy = TcpProxy(str(target.get("host", "127.0.0.1")), int(target.get("port", 5432))).start()
    yield proxy
    proxy.cut()


def _series_when(app, check, timeout):
    def attempt():
        series = scrape_series(app)
        return series if check(series) else None

    return wait_for(attempt, timeout=timeout)


def _timeouts(series, source):
    return value(series, "queue_exporter_source_errors_total", source=source, reason="timeout")


def test_frozen_redis_is_withdrawn_within_two_intervals_and_recovers(
    redis_proxy, redis_client, redis_db, run_exporter, caplog
):
    interval = 2.0
    redis_client.rpush("jobs:emails", "a", "b")
    url = f"redis://127.0.0.1:{redis_proxy.port}/{redis_db}"
    # socket_timeout stays at its 5 s default: the whole-cycle deadline is what notices.
    source = {"url": url, "key_groups": [KEY_GROUP], "cycle_timeout": interval / 2}
    app = run_exporter({"sample_interval": interval, "sources": {"redis": source}})
    depth = {"queue": "emails", "state": "pending"}
    _series_when(app, lambda s: value(s, "queue_depth", **depth) == 2, timeout=20)
    assert is_ready(app.server.port)

    caplog.set_level(logging.INFO, logger="exporter.sources.runner")
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    redis_proxy.freeze()
    frozen = time.monotonic()
    series = _series_when(
        app,
        lambda s: value(s, "queue_exporter_source_up", source="redis") == 0,
        timeout=2 * interval + 5 * lag,
    )
    print(
        f"\nfrozen Redis: withdrawn after {time.monotonic() - frozen:.1f} s (interval {interval:g} s)"
    )
    assert value(series, "queue_depth", **depth) is None  # withdrawn, not served stale
    assert _timeouts(series, "redis") >= 1
    assert not is_ready(app.server.port)
    assert "no answer within its 1s deadline" in caplog.text
    # Every cycle keeps failing and is counted, but the outage is logged once.
    _series_when(app, lambda s: (_timeouts(s, "redis") or 0) >= 3, timeout=20)
    assert caplog.text.count("source redis failed (timeout)") == 1

    redis_client.rpush("jobs:emails", "c")
    redis_proxy.thaw()
    series = _series_when(app, lambda s: value(s, "queue_depth", **depth) == 3, timeout=20)
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    assert is_ready(app.server.port)
    assert "source redis is back" in caplog.text


def test_frozen_postgres_is_withdrawn_within_two_intervals_and_recovers(
    postgres_proxy, postgres_dsn, run_exporter, caplog
):
    interval = 2.5
    via_proxy = make_conninfo(postgres_dsn, host="127.0.0.1", port=postgres_proxy.port)
    postgres = {
        "dsn": via_proxy,
        "connect_timeout": 1,
        "statement_timeout": 0.5,  # the client gives up at connect_timeout + this: 1.5 s
        "collectors": [COLLECTOR],
    }
    app = run_exporter({"sample_interval": interval, "sources": {"postgres": postgres}})
    source = "postgres:backlog"
    _series_when(app, lambda s: value(s, "app_backlog", queue="emails") == 4, timeout=20)
    assert is_ready(app.server.port)

    caplog.set_level(logging.WARNING, logger="exporter.sources.runner")
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    postgres_proxy.freeze()  # the server never answers; statement_timeout cannot fire
    frozen = time.monotonic()
    series = _series_when(
        app,
        lambda s: value(s, "queue_exporter_source_up", source=source) == 0,
        timeout=2 * interval + 5 * lag,
    )
    print(
        f"\nfrozen PostgreSQL: withdrawn after {time.monotonic() - frozen:.1f} s (interval {interval:g} s)"
    )
    assert value(series, "app_backlog", queue="emails") is None
    assert _timeouts(series, source) >= 1
    assert not is_ready(app.server.port)
    assert f"source {source} failed (timeout)" in caplog.text

    time.sleep(interval)  # the pool's reconnects meet the frozen server too, and time out
    postgres_proxy.thaw()
    series = _series_when(
        app, lambda s: value(s, "queue_exporter_source_up", source=source) == 1, timeout=30
    )
    assert value(series, "app_backlog", queue="emails") == 4
    assert is_ready(app.server.port)


def test_connecting_to_a_frozen_postgres_fails_within_connect_timeout(postgres_proxy, postgres_dsn):
    via_proxy = make_conninfo(postgres_dsn, host="127.0.0.1", port=postgres_proxy.port)
    config = PostgresSourceConfig(dsn=via_proxy, connect_timeout=2)
    postgres_proxy.freeze()  # TCP connects; the server's startup reply never comes
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    started = time.monotonic()
    # The parameters the pool connects with: psycopg enforces connect_timeout on the client.
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        psycopg.connect(config.conninfo(), **config.connect_kwargs())
    assert time.monotonic() - started < 2 * config.connect_timeout + 5 * lag


def test_watchdog_interrupts_only_a_call_that_overruns():
    released = threading.Event()
    with Watchdog(0.05, released.set) as watchdog:
        assert released.wait(timeout=30)  # a call blocked until something interrupts it
    assert watchdog.fired

    interrupted = threading.Event()
    with Watchdog(0.05, interrupted.set) as watchdog:
        pass  # done in time
    assert not interrupted.wait(timeout=0.2)  # four deadlines later: still not interrupted
    assert not watchdog.fired


def test_deadlines_default_to_the_interval_and_the_timeouts():
    config = from_dict(
        {
            "sample_interval": 7,
            "sources": {
                "redis": {"key_groups": [KEY_GROUP]},
                "postgres": {
                    "connect_timeout": 2,
                    "statement_timeout": 3,
                    "collectors": [COLLECTOR],
                },
            },
        }
    )
    telemetry = Telemetry(HealthBoard())
    try:
        redis_sampler, collector = build(config, telemetry, None).sources
        assert redis_sampler.deadline == 7  # a cycle may take its interval
        assert collector.deadline == 2 + 3  # a connection, then the query
        for source in (redis_sampler, collector):
            source.close()
    finally:
        telemetry.shutdown()


@pytest.fixture
def hung_otlp_collector(monkeypatch):
    """An OTLP endpoint whose TCP handshake succeeds (the kernel's backlog) but never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        yield endpoint


def test_sigterm_ends_serve_within_5s_while_backends_are_frozen(
    redis_proxy,
    postgres_proxy,
    hung_otlp_collector,
    redis_client,
    redis_db,
    postgres_dsn,
    serve_process,
    tmp_path,
):
    redis_client.rpush("orchestrata:dlq:billing", "{}")
    config = {
        "otlp": {"enabled": True, "interval": 60},  # its last push at exit meets a hung collector
        "sample_interval": 1,
        "presets": ["orchestrata", "attune"],
        "sources": {
            "redis": {"url": f"redis://127.0.0.1:{redis_proxy.port}/{redis_db}"},
            "postgres": {
                "dsn": make_conninfo(postgres_dsn, host="127.0.0.1", port=postgres_proxy.port)
            },
            "events": {"streams": [{"key": "app:events", "system": "app"}]},
        },
        # The lease lives in the frozen Redis too: its renewal and release must not hold the
        # exit. It outlasts the wait below: a lapsed lease stops the sources, and with them the
        # requests the test waits to see blocked (load run: not all were seen within 10 s)
        "leader_election": {"enabled": True, "lease_ttl": 120, "renew_interval": 1},
    }
    config_file = tmp_path / "queue-exporter.yaml"
    config_file.write_text(yaml.safe_dump(config))
    serve = serve_process("--config", str(config_file))
    # Attune's tables are missing: its collectors fail fast, but they do talk to the server.
    before = serve.series_when(
        lambda s: (
            value(s, "queue_depth", queue="billing") == 1
            and value(s, "queue_exporter_leader") == 1
            and value(
                s,
                "queue_exporter_source_errors_total",
                source="postgres:attune_queue_stats",
                reason="missing_table",
            )
        )
    )
    redis_proxy.freeze()
    postgres_proxy.freeze()
    # Every client has blocked: the lease's renewal, the consumer's read, the key sampler's scan
    # and a collector's query waited on the frozen servers (a sleep may end before they do).
    # Each is noted once seen: one cut off at its deadline backs off before it waits again, so
    # on a loaded host all of them at one moment may never be seen. The consumer may also be
    # caught between reads (its XREAD cut off before a poll saw it, its reconnect's HELLO held):
    # a read of it cut off at its deadline after the freeze shows that it waited there too.
    seen: set[str] = set()
    timeouts_before = _consumer_timeouts(before)

    def every_client_blocked() -> bool:
        seen.update(redis_proxy.awaiting())
        if _consumer_timeouts(parse_exposition(scrape(serve.port))) > timeouts_before:
            seen.add(CONSUMER_CUT_OFF)
        return _all_blocked(seen, postgres_proxy.held())

    try:
        wait_for(every_client_blocked, timeout=60)
    except AssertionError as error:  # which client never blocked, for the next red run
        held = postgres_proxy.held()
        raise AssertionError(
            f"{error}: Redis commands seen {sorted(seen)}, PG held {held}"
        ) from None
    load = process_cost()  # what this machine's load adds to a process's stop, now
    stopped_in, stderr = serve.sigterm()
    assert stopped_in < 5 + load, (stopped_in, load, stderr[-3000:])
    assert "shutting down" in stderr
    assert "could not release the lease" in stderr  # left to expire, within lease_ttl


# Noted among the commands seen waiting: the consumer waited on the frozen Redis until cut off.
CONSUMER_CUT_OFF = "(the consumer, cut off at its deadline)"


def _consumer_timeouts(series: Series) -> float:
    """How many of the events consumer's Redis calls were cut off at their deadline."""
    errors = "queue_exporter_source_errors_total"
    return total(series, errors, source="events:app:events", reason="timeout")


def _all_blocked(redis_awaiting: set[str], postgres_held: int) -> bool:
    consumer_reading = bool(redis_awaiting & {"XREAD", "XREADGROUP", CONSUMER_CUT_OFF})
    return {"EVALSHA", "SCAN"} <= redis_awaiting and consumer_reading and postgres_held > 0


def test_check_config_connect_gives_up_on_a_frozen_redis_at_the_cycle_deadline(
    redis_proxy, redis_db, tmp_path
):
    url = f"redis://127.0.0.1:{redis_proxy.port}/{redis_db}"
    config = {"sources": {"redis": {"url": url, "cycle_timeout": 0.5, "key_groups": [KEY_GROUP]}}}
    config_file = tmp_path / "queue-exporter.yaml"
    config_file.write_text(yaml.safe_dump(config))
    redis_proxy.freeze()
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(config_file), "--connect"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    # Cut off at the cycle's deadline, not at the 5 s socket timeout of each command.
    assert f"redis keys at {url}: FAILED (timeout: no answer within its 0.5s deadline)" in (
        result.stdout
    )


class _UninterruptibleSource:
    """A cycle stuck past its deadline in a call that cannot be interrupted; it ends on its own."""

    name = "stuck"
    interval = 0.1
    deadline = 0.1

    def sample(self) -> SampleSet:
        time.sleep(0.3)
        raise OSError("its own socket timeout, at last")

    def interrupt(self) -> None:
        raise RuntimeError("cannot interrupt this")

    def error_reason(self, error: Exception) -> str:
        return "connection"

    def close(self) -> None:
        pass


def test_an_interrupt_that_raises_fails_only_its_cycle(caplog):
    telemetry = Telemetry(HealthBoard())
    runner = SourceRunner(_UninterruptibleSource(), telemetry, threading.Event())
    try:
        assert not runner.run_once()  # failed, as a timeout: its deadline passed
        assert telemetry.health.snapshot()["stuck"].last_error == "timeout"
        runner.interrupt()  # what shutdown calls: logged, not raised
        assert caplog.text.count("source stuck: interrupting its cycle failed") == 2
    finally:
        telemetry.shutdown()
