"""`check-config --connect`: reach every backend once and say what serve would find there.

Each part runs the code serve runs (one Redis key sampler cycle, one query per SQL collector)
so what it prints is what /metrics would show: per key group the keys matched with a few
examples and the series they give, per events stream its length, consumer groups and lag,
per SQL collector its rows and the series they give. A backend that cannot be reached is
named and makes the command fail; the others are still tried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import redis

from exporter.catalog import BY_NAME
from exporter.config import Config
from exporter.events.config import StreamConfig
from exporter.health import HealthBoard, KeyGroupReport
from exporter.inventory import events_redis
from exporter.logs import scrub
from exporter.redis_connection import RedisConnectionConfig, redis_error_reason
from exporter.samples import LabelValues, SampleSet
from exporter.sources import postgres
from exporter.sources.base import DeadlineExceeded, sample_within_deadline
from exporter.sources.key_types import REASON_WORDS
from exporter.sources.redis_keys import RedisKeySampler, redis_samplers
from exporter.telemetry import Telemetry

Echo = Callable[[str], None]
SHOWN_SERIES = 5


def probe(config: Config, echo: Echo) -> list[str]:
    """Print what each backend holds for the configuration; the failures, named."""
    telemetry = Telemetry(HealthBoard(), config.limits)
    try:
        failures = _key_groups(config, telemetry, echo)
        failures += _streams(config, echo)
        failures += _sql_collectors(config, telemetry, echo)
    finally:
        telemetry.shutdown()
    return failures


def _key_groups(config: Config, telemetry: Telemetry, echo: Echo) -> list[str]:
    failures = []
    for sampler in redis_samplers(config.sources.redis, telemetry, config.sample_interval):
        failures += _sampler_key_groups(sampler, telemetry, echo)
    return failures


def _sampler_key_groups(sampler: RedisKeySampler, telemetry: Telemetry, echo: Echo) -> list[str]:
    target = sampler.config.masked_url()
    try:
        samples = sample_within_deadline(sampler)
    except Exception as error:
        reason = "timeout" if isinstance(error, DeadlineExceeded) else redis_error_reason(error)
        echo(f"redis keys at {target}: FAILED ({reason}: {_first_line(error)})")
        return [f"redis keys at {target}"]
    finally:
        sampler.close()
    echo(f"redis keys at {target}:")
    depths = _values(samples, "queue_depth")
    ages = _values(samples, "queue_oldest_age_seconds")
    for report in telemetry.health.key_groups():
        if report.source != sampler.name:
            continue
        for line in _key_group_lines(report, depths, ages):
            echo(f"  {line}")
    return []


def _key_group_lines(
    report: KeyGroupReport, depths: dict[LabelValues, float], ages: dict[LabelValues, float]
) -> Iterator[str]:
    examples = ", ".join(report.example_keys)
    more = ", ..." if report.keys_matched > len(report.example_keys) else ""
    yield (
        f"key group {report.pattern} ({report.system}, {report.type}): "
        f"{report.keys_matched} key(s) matched{f' e.g. {examples}{more}' if examples else ''}; "
        f"{report.queues} queue(s), {report.series} series"
    )
    for labels in report.example_series[:SHOWN_SERIES]:
        system, queue, priority, state = labels
        shown = f'queue="{queue}", priority="{priority}", state="{state}"'
        age = ages.get(labels)
        age_text = f", queue_oldest_age_seconds {age:.1f}" if age is not None else ""
        yield f'    queue_depth{{system="{system}", {shown}}} {depths.get(labels, 0):g}{age_text}'
    for reason, count in sorted(report.errors.items()):
        yield f"    {count} error(s) {reason}: {REASON_WORDS.get(reason, reason)}"
    if report.last_warning is not None:
        yield f"    WARNING: {report.last_warning}"


def _streams(config: Config, echo: Echo) -> list[str]:
    events = config.sources.events
    if events is None or not events.streams:
        return []
    shared = events_redis(config)
    with_shared = [stream for stream in events.streams if stream.redis is None]
    failures = _streams_at(shared, with_shared, echo) if with_shared else []
    for stream in events.streams:
        if stream.redis is not None:  # a stream on a Redis of its own
            failures += _streams_at(stream.redis, [stream], echo)
    return failures


def _streams_at(
    connection: RedisConnectionConfig, streams: list[StreamConfig], echo: Echo
) -> list[str]:
    target = connection.masked_url()
    client = connection.connect()
    try:
        echo(f"events streams at {target}:")
        for stream in streams:
            echo(f"  {_stream_line(client, stream.key, stream.group)}")
    except redis.RedisError as error:
        echo(f"events at {target}: FAILED ({redis_error_reason(error)}: {_first_line(error)})")
        return [f"events Redis at {target}"]
    finally:
        client.close()
    return []


def _stream_line(client: redis.Redis, key: str, wanted: str) -> str:
    if not client.exists(key):
        return f"stream {key}: does not exist yet (the group is made when it appears)"
    length = client.xlen(key)
    groups = client.xinfo_groups(key)
    names = [_text(group["name"]) for group in groups]
    ours = next((group for group in groups if _text(group["name"]) == wanted), None)
    if ours is None:
        state = f"group {wanted} not created yet (made on first read)"
    else:
        state = f"group {wanted}: lag {ours.get('lag')}, pending {ours.get('pending')}"
    return f"stream {key}: length {length}, groups {', '.join(names) or 'none'}; {state}"


def _sql_collectors(config: Config, telemetry: Telemetry, echo: Echo) -> list[str]:
    postgres_config = config.sources.postgres
    if postgres_config is None or not postgres_config.collectors:
        return []
    target = postgres_config.masked_dsn() or f"DSN from {postgres_config.dsn_file}"
    echo(f"postgres at {target}:")
    failures = []
    sources = postgres.build_sources(postgres_config, telemetry, config.sample_interval)
    try:
        for source in sources:
            try:
                samples = sample_within_deadline(source)
            except Exception as error:
                reason = (
                    "timeout"
                    if isinstance(error, DeadlineExceeded)
                    else postgres.error_reason(error)
                )
                echo(f"  {source.name}: FAILED ({reason}: {_first_line(error)})")
                failures.append(source.name)
                continue
            echo(f"  {source.name}: {source.last_rows} row(s); {_series_summary(samples)}")
    finally:
        for source in sources:
            source.close()
    return failures


def _series_summary(samples: SampleSet) -> str:
    parts = [f"{spec.name} {len(series)}" for spec, series in samples.metrics()]
    return f"series: {', '.join(parts)}" if parts else "no rows, no series"


def _values(samples: SampleSet, name: str) -> dict[LabelValues, float]:
    # labels[:width]: the queue labels, without the redis_source of several Redis sources
    width = len(BY_NAME[name].labels)
    for spec, series in samples.metrics():
        if spec.name == name:
            return {labels[:width]: value for labels, value in series.items()}
    return {}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _first_line(error: BaseException) -> str:
    text = scrub(str(error)).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
