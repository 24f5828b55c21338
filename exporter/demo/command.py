"""`queue-exporter demo`: servers (given or embedded), the workload, the exporter, a status line.

Shutdown (Ctrl-C, SIGTERM, or --duration reached) runs in reverse: the workload stops, the
exporter stops, the demo's data is deleted from servers it did not start, embedded servers
stop and their directory is removed.
"""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import click
import psycopg
import redis

from exporter.commands.cli import env_option
from exporter.config import presets
from exporter.config import settings as config_module
from exporter.core.logs import configure as configure_logging
from exporter.demo import sim_legacy, sim_orchestrata
from exporter.demo.embedded import EmbeddedError, EmbeddedServers
from exporter.demo.status import StatusLine
from exporter.demo.workload import Workload, WorkloadError
from exporter.runtime.signals import SignalInbox

# The exporter's port, on loopback only: the demo serves /metrics without authentication.
DEMO_LISTEN_ADDRESS = "127.0.0.1:" + config_module.DEFAULT_LISTEN_ADDRESS.rpartition(":")[2]


DEMO_PRESETS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("orchestrata", {"max_depth": sim_orchestrata.MAX_DEPTH}),
    ("runnerq", {}),
    ("attune", {}),
)


@click.command()
@env_option(
    "redis_url",
    help="Use this Redis (an empty database) instead of an embedded one.",
)
@env_option(
    "postgres_dsn",
    help="Use this PostgreSQL database instead of an embedded one.",
)
@env_option(
    "listen_address",
    default=DEMO_LISTEN_ADDRESS,
    show_default=True,
    help="HOST:PORT of the exporter (port 0: any free port; 0.0.0.0:9839 for a Prometheus "
    "in a container).",
)
@click.option(
    "--duration", type=float, default=0.0, help="Seconds to run; 0 (default) runs until Ctrl-C."
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0.1, max=2000),
    default=20.0,
    show_default=True,
    help="Jobs per second arriving at each system.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of every random choice.")
@click.option(
    "--sample-interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between the exporter's samples.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
def demo(**options: Any) -> None:
    """Run a live demo: a synthetic workload of Orchestrata, Runner-Q and Attune, and the
    exporter reading it. Starts embedded Redis and PostgreSQL unless given."""
    settings = DemoSettings(**options)
    configure_logging(settings.log_level, "text")
    signals = SignalInbox(signal.SIGTERM, signal.SIGINT)  # either one stops the demo
    try:
        with ExitStack() as cleanup:
            _run(cleanup, signals, settings)
    except (EmbeddedError, WorkloadError, config_module.ConfigError) as error:
        raise click.ClickException(str(error)) from None
    click.echo("demo stopped; everything it started is gone")


@dataclass(frozen=True)
class DemoSettings:
    """The demo command's options."""

    redis_url: str | None
    postgres_dsn: str | None
    listen_address: str
    duration: float
    rate: float
    seed: int
    sample_interval: float
    log_level: str


def _run(cleanup: ExitStack, signals: SignalInbox, settings: DemoSettings) -> None:
    redis_url, postgres_dsn = settings.redis_url, settings.postgres_dsn
    servers: EmbeddedServers | None = None
    if redis_url is None or postgres_dsn is None:
        servers = EmbeddedServers()
        cleanup.callback(servers.stop)
    if redis_url is None:
        assert servers is not None
        redis_url = servers.start_redis()
        _say(f"embedded Redis {servers.redis_version} at {redis_url}")
    else:
        _check_redis(redis_url)
    if postgres_dsn is None:
        assert servers is not None
        postgres_dsn = servers.start_postgres()
        _say(f"embedded PostgreSQL {servers.postgres_version} at {postgres_dsn}")
    else:
        _check_postgres(postgres_dsn)
    if servers is not None:
        _say(f"their files: {servers.workdir} (removed on exit)")
    if signals.wait(0) is not None:
        return

    workload = Workload(redis_url, postgres_dsn, settings.rate, settings.seed)
    cleanup.callback(workload.close)
    workload.check()  # refuses servers that already hold the demo's names
    # Servers the demo did not start: delete what it wrote, once the exporter stopped.
    cleanup.callback(workload.remove_data, redis=servers is None or not servers.redis_version,
                     postgres=servers is None or not servers.postgres_version)  # fmt: skip
    workload.setup()

    from exporter.runtime.app import App  # the heavy imports only once the servers are up

    config = config_module.from_dict(
        exporter_config(
            redis_url,
            postgres_dsn,
            settings.listen_address,
            settings.sample_interval,
            settings.log_level,
        )
    )
    # The workload writes first: the exporter's first sample finds every queue it reads, not
    # a configuration that looks wrong (a key group matching nothing, a stream not there).
    workload_running = threading.Event()  # the workload's own stop: Ctrl-C stops the demo
    workload.start(workload_running)
    cleanup.callback(workload.join)
    cleanup.callback(workload_running.set)
    if not _wait_until_fed(workload, config, signals):
        return
    try:
        app = App(config)
    except OSError as error:
        raise click.ClickException(
            f"cannot listen on {config.listen_address}: {error.strerror}"
        ) from None
    app.start()
    cleanup.callback(app.shutdown)
    cleanup.callback(workload.stop_events)  # flushed before the exporter stops reading
    cleanup.callback(workload.join)
    cleanup.callback(workload_running.set)
    _banner(config, app.server.port, settings.rate, settings.seed)
    _status_loop(
        signals,
        settings.duration,
        StatusLine(app.telemetry.own_samples, app.telemetry.store.families),
        workload,
    )


# How long the exporter waits for the workload to write every key and stream it reads.
FEED_TIMEOUT = 30.0


def _wait_until_fed(workload: Workload, config: config_module.Config, signals: SignalInbox) -> bool:
    """Until each key group of the configuration has a key and each stream exists (at most
    FEED_TIMEOUT: past it the exporter starts and its own warnings name what is missing);
    False when a signal stopped the demo meanwhile."""
    from exporter.sources.redis_keys.groups import scan_glob

    redis_config = config.sources.default_redis()
    groups = redis_config.key_groups if redis_config is not None else []
    events = config.sources.events
    wanted = [(group.pattern, scan_glob(group.pattern)) for group in groups]
    wanted += [(stream.key, scan_glob(stream.key)) for stream in events.streams] if events else []
    deadline = time.monotonic() + FEED_TIMEOUT
    while (missing := workload.missing(wanted)) and time.monotonic() < deadline:
        if signals.wait(0.2) is not None:
            return False
    if missing:
        _say(f"the workload has not written {', '.join(missing)} yet: the exporter will say so")
    return True


def exporter_config(
    redis_url: str, postgres_dsn: str, listen_address: str, sample_interval: float, log_level: str
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "listen_address": listen_address,
        "sample_interval": sample_interval,
        "log_level": log_level,
        "limits": {"max_series_per_metric": sim_legacy.MAX_SERIES_PER_METRIC},
        "sources": {
            "redis": {"url": redis_url},
            "postgres": {"dsn": postgres_dsn},
            "events": {
                # From its first entry: the workload writes before the exporter starts (on a
                # busy host, seconds before), and a fault staged once (the invalid event) would
                # be missed by a group created at $
                "streams": [
                    {"key": sim_orchestrata.EVENTS_STREAM, "system": "orchestrata", "start": "0"}
                ],
                "stats_interval": sample_interval,
                "worker_timeout": 10,
            },
        },
    }
    for name, params in DEMO_PRESETS:
        raw = presets.merge(raw, presets.expand(name, params))
    # After the presets' groups, like any operator's addition would read best.
    raw["sources"]["redis"]["key_groups"].append(sim_legacy.KEY_GROUP)
    return raw


def _banner(config: config_module.Config, port: int, rate: float, seed: int) -> None:
    from exporter.demo.workload import STAGED_FAULTS

    staged = "\n".join(_wrapped(f"- {fault}") for fault in STAGED_FAULTS)
    host, _ = config.host_port
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    target = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
    _say(
        f"""
workload: Orchestrata (4 recipients, producer-library events), Runner-Q (queue default,
  its events stream), Attune (queue_stats in PostgreSQL), a legacy per-tenant layout;
  {rate:g} jobs/s, seed {seed}

metrics: http://{target}/metrics

Prometheus scrape config (prometheus.yml):

  scrape_configs:
    - job_name: queue-exporter
      scrape_interval: 5s
      static_configs:
        - targets: ["{target}"]
  rule_files:
    - alerts/queue-exporter.rules.yml

Dashboards: in Grafana, Dashboards > New > Import each dashboards/queue-exporter-*.json
(from this repository; the Helm chart ships the same files) and pick that Prometheus.
Rules and alerts: alerts/queue-exporter.rules.yml, as in rule_files above.

Staged on purpose (the warnings and alerts they raise are the demo's, not a mistake):
{staged}

Ctrl-C stops the demo and removes everything it started.
"""
    )


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=92, subsequent_indent="  ")


def _status_loop(
    signals: SignalInbox, duration: float, status: StatusLine, workload: Workload
) -> None:
    started = time.monotonic()
    live = sys.stdout.isatty()
    interval = 1.0 if live else 10.0
    while True:
        remaining = duration - (time.monotonic() - started) if duration else interval
        if signals.wait(max(0.0, min(interval, remaining))) is not None:
            break
        elapsed = time.monotonic() - started
        line = status.render(elapsed, workload.depth())
        if live:
            click.echo("\r" + line, nl=False)
        else:
            click.echo(line)
        if duration and elapsed >= duration:
            break
    if live:
        click.echo()


def _check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        raise click.ClickException(f"cannot reach Redis given by --redis-url: {error}") from None
    finally:
        client.close()


def _check_postgres(dsn: str) -> None:
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            pass
    except psycopg.Error as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise click.ClickException(
            f"cannot reach PostgreSQL given by --postgres-dsn: {message}"
        ) from None


def _say(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()
