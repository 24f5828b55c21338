"""`check-config --connect`: reach every backend once and say what serve would find there.

Each part runs the code serve runs (one Redis key sampler cycle, one query per SQL collector)
so what it prints is what /metrics would show: per key group the keys matched with a few
examples and the series they give, per events stream its length, consumer groups and lag,
per SQL collector its rows and the series they give. A backend that cannot be reached is
named and makes the command fail; the others are still tried.

What would run but not as meant is a warning, named on a line of its own for the verdict
(`OK with N warnings`): a key group that matched nothing, a key of another Redis type than
its group's (the type found named), a database with no keys at all, queues found in Redis but
not configured (a group's `select` left them out), a native reader whose system has left no
record where it reads, and keys a group could not read. Each command a native reader will
send is tried in a harmless form (redis_acl.COMMAND_TRIALS) under the configured user: one
refused is named with what the ACL (or the server) needs, a failure, or a warning when it costs
one figure only (BullMQ's and Bull's CLIENT LIST: their worker count). The Celery reader is run for
CELERY_WATCH seconds (two worker heartbeats): the workers its inspection found, with their
queues and slots, and a warning for workers that process tasks without sending task events
(-E missing), for tasks whose queue it could not learn, and for a worker of several queues
whose routes cannot be read (what would tell its tasks' queue).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis

from exporter.commands.redis_acl import COMMAND_TRIALS, key_of, refusal_needs
from exporter.config.inventory import events_redis
from exporter.config.settings import Config
from exporter.core.logs import scrub
from exporter.core.printable import printable
from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard, KeyGroupReport
from exporter.output.samples import LabelValues, SampleSet
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason
from exporter.sources.postgres import source as postgres
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.readers.config import CeleryReaderConfig, ReaderConfig
from exporter.sources.redis_keys.groups import KeyGroup
from exporter.sources.redis_keys.sampler import RedisKeySampler, redis_samplers
from exporter.sources.redis_keys.types import REASON_WORDS
from exporter.sources.source import DeadlineExceeded, sample_within_deadline
from exporter.sources.streams.config import StreamConfig

Echo = Callable[[str], None]
SHOWN_SERIES = 5
# SCAN calls a native reader's record check makes at most (COUNT 1000 each): a database too
# large to find a record in that many is not called empty.
RECORD_SCANS = 100
# Seconds the Celery reader is watched: two worker heartbeats (every 2 s) tell a worker that
# processes tasks without sending task events.
CELERY_WATCH = 5.0


@dataclass
class Findings:
    """What the probe found wrong: failures (a backend that did not answer) and warnings
    (what answered, but not as the configuration means)."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Redis targets that did not answer: named once, not tried again by the later parts
    unreachable: set[str] = field(default_factory=set)

    def add(self, other: Findings) -> None:
        self.failures += other.failures
        self.warnings += other.warnings
        self.unreachable |= other.unreachable


def probe(config: Config, echo: Echo) -> Findings:
    """Print what each backend holds for the configuration; the failures and warnings, named."""
    telemetry = Telemetry(HealthBoard(), config.limits)
    findings = Findings()
    try:
        findings.add(_key_groups(config, telemetry, echo))
        findings.add(_streams(config, echo, findings.unreachable))
        findings.add(_sql_collectors(config, telemetry, echo))
        findings.add(_native_readers(config, echo, findings.unreachable))
    finally:
        telemetry.shutdown()
    return findings


def _key_groups(config: Config, telemetry: Telemetry, echo: Echo) -> Findings:
    findings = Findings()
    for sampler in redis_samplers(config.sources.redis, telemetry, config.sample_interval):
        findings.add(_sampler_key_groups(sampler, telemetry, echo))
    return findings


def _sampler_key_groups(sampler: RedisKeySampler, telemetry: Telemetry, echo: Echo) -> Findings:
    target = sampler.config.masked_url()
    try:
        samples = sample_within_deadline(sampler)
    except Exception as error:
        reason = "timeout" if isinstance(error, DeadlineExceeded) else redis_error_reason(error)
        echo(f"redis keys at {target}: FAILED ({reason}: {_first_line(error)})")
        return Findings(failures=[f"redis at {target}"], unreachable={target})
    finally:
        sampler.close()
    echo(f"redis keys at {target}:")
    findings = Findings()
    empty = _database_empty(sampler.config)
    if empty:
        findings.warnings.append(
            f"redis at {target}: the database holds no keys at all (DBSIZE 0): the wrong "
            "database number in the URL, or nothing has written there yet"
        )
    depths = _values(samples, "queue_depth")
    ages = _values(samples, "queue_oldest_age_seconds")
    reports = [report for report in telemetry.health.key_groups() if report.source == sampler.name]
    for report in reports:
        for line in _key_group_lines(report, depths, ages):
            echo(f"  {line}")
        findings.warnings += _key_group_warnings(sampler, report)
    if not empty:
        findings.warnings += _unmatched_groups(sampler.config.key_groups, reports)
    return findings


def _unmatched_groups(groups: list[KeyGroup], reports: list[KeyGroupReport]) -> list[str]:
    """The key groups that matched no key, as warnings: one line per system none of whose
    groups matched anything (a system absent, or the wrong database), else one per group
    that found nothing by SCAN (a typo, or its queues all empty). A group whose keys are
    built from queue names it was given is not one: its queues read 0, which is the truth."""
    unmatched: dict[str, list[KeyGroupReport]] = {}
    matched: set[str] = set()
    for group, report in zip(groups, reports, strict=True):
        if report.keys_matched:
            matched.add(report.system)
        elif not (group.enumerated and report.queues):
            unmatched.setdefault(report.system, []).append(report)
    warnings = []
    for system, found_nothing in unmatched.items():
        if system in matched or len(found_nothing) == 1:
            warnings += [
                f"{_group_name(report)}: {report.last_warning or 'matched no keys'}"
                for report in found_nothing
            ]
            continue
        patterns = ", ".join(printable(report.pattern) for report in found_nothing)
        warnings.append(
            f"system {system}: none of its {len(found_nothing)} key groups matched a key "
            f"({patterns}): {system} has not written to this database (the wrong database "
            "number?) or every queue of it is empty"
        )
    return warnings


def _some(values: tuple[str, ...]) -> str:
    """The first few values, printable, and how many more."""
    shown = ", ".join(printable(value) for value in values[:SHOWN_SERIES])
    more = len(values) - SHOWN_SERIES
    return f"{shown} and {more} more" if more > 0 else shown


def _group_name(report: KeyGroupReport) -> str:
    return f"key group {printable(report.pattern)} ({report.system}, {report.type})"


def _database_empty(connection: RedisConnectionConfig) -> bool:
    """DBSIZE 0 on the source's server (not asked of a cluster: its nodes each hold a part)."""
    if connection.is_cluster:
        return False
    client = connection.connect()
    try:
        return int(client.dbsize()) == 0
    except redis.RedisError:  # the cycle itself answered: a refused DBSIZE (ACL) proves nothing
        return False
    finally:
        client.close()


def _key_group_warnings(sampler: RedisKeySampler, report: KeyGroupReport) -> Iterator[str]:
    """A group's queues found but not configured, and its keys that could not be read (the
    wrong types with the type found), as warnings."""
    group = _group_name(report)
    if report.unselected:
        yield (
            f"{group}: found in Redis but not configured, not counted: "
            f"{_some(report.unselected)} (add them to the selection, e.g. the preset's queues "
            "param, or '*' for every one found)"
        )
    wrong = [key for reason, key in report.failed_keys if reason == "wrong_type"]
    for key in wrong:
        found = _type_of(sampler.config, key)
        yield (
            f"{group}: key {printable(key)} holds a Redis {found}, the group reads a {report.type}"
        )
    for reason in sorted(set(report.errors) - {"wrong_type", "no_keys"}):
        words = REASON_WORDS.get(reason, reason)
        keys = tuple(key for failed, key in report.failed_keys if failed == reason)
        named = f" ({_some(keys)})" if keys else ""
        yield f"{group}: {report.errors[reason]} key(s){named}: {words} [{reason}]"


def _type_of(connection: RedisConnectionConfig, key: str) -> str:
    """The Redis type `key` holds now (TYPE), or why it could not be read."""
    try:
        client = connection.connect_cluster() if connection.is_cluster else connection.connect()
    except redis.RedisError as error:
        return f"of a type not read ({redis_error_reason(error)})"
    try:
        found = _text(client.type(key))
    except redis.RedisError as error:
        return f"of a type not read ({redis_error_reason(error)})"
    finally:
        client.close()
    return "(gone since)" if found == "none" else found


def _key_group_lines(
    report: KeyGroupReport, depths: dict[LabelValues, float], ages: dict[LabelValues, float]
) -> Iterator[str]:
    examples = ", ".join(printable(key) for key in report.example_keys)
    more = ", ..." if report.keys_matched > len(report.example_keys) else ""
    yield (
        f"key group {printable(report.pattern)} ({report.system}, {report.type}): "
        f"{report.keys_matched} key(s) matched{f' e.g. {examples}{more}' if examples else ''}; "
        f"{report.queues} queue(s), {report.series} series"
    )
    for labels in report.example_series[:SHOWN_SERIES]:
        system, queue, priority, state = labels
        shown = f'queue="{printable(queue)}", priority="{priority}", state="{state}"'
        age = ages.get(labels)
        age_text = f", queue_oldest_age_seconds {age:.1f}" if age is not None else ""
        yield f'    queue_depth{{system="{system}", {shown}}} {depths.get(labels, 0):g}{age_text}'
    for reason, count in sorted(report.errors.items()):
        yield f"    {count} error(s) {reason}: {REASON_WORDS.get(reason, reason)}"
    if report.last_warning is not None:
        yield f"    WARNING: {report.last_warning}"


def _streams(config: Config, echo: Echo, unreachable: set[str]) -> Findings:
    events = config.sources.events
    findings = Findings()
    if events is None or not events.streams:
        return findings
    shared = events_redis(config)
    with_shared = [stream for stream in events.streams if stream.redis is None]
    if with_shared:
        findings.add(_streams_at(shared, with_shared, echo, unreachable))
    for stream in events.streams:
        if stream.redis is not None:  # a stream on a Redis of its own
            findings.add(_streams_at(stream.redis, [stream], echo, unreachable))
    return findings


def _streams_at(
    connection: RedisConnectionConfig,
    streams: list[StreamConfig],
    echo: Echo,
    unreachable: set[str],
) -> Findings:
    target = connection.masked_url()
    if target in unreachable:  # named FAILED above
        return Findings()
    client = connection.connect()
    try:
        lines = [_stream_line(client, stream.key, stream.group) for stream in streams]
    except redis.RedisError as error:
        echo(f"events at {target}: FAILED ({redis_error_reason(error)}: {_first_line(error)})")
        return Findings(failures=[f"redis at {target}"], unreachable={target})
    finally:
        client.close()
    echo(f"events streams at {target}:")
    for line in lines:
        echo(f"  {line}")
    return Findings()


def _stream_line(client: redis.Redis, key: str, wanted: str) -> str:
    shown = printable(key)
    if not client.exists(key):
        return f"stream {shown}: does not exist yet (the group is made when it appears)"
    length = client.xlen(key)
    groups = client.xinfo_groups(key)
    names = [printable(_text(group["name"])) for group in groups]
    ours = next((group for group in groups if _text(group["name"]) == wanted), None)
    if ours is None:
        state = f"group {printable(wanted)} not created yet (made on first read)"
    else:
        state = f"group {printable(wanted)}: lag {ours.get('lag')}, pending {ours.get('pending')}"
    return f"stream {shown}: length {length}, groups {', '.join(names) or 'none'}; {state}"


def _sql_collectors(config: Config, telemetry: Telemetry, echo: Echo) -> Findings:
    postgres_config = config.sources.postgres
    if postgres_config is None or not postgres_config.collectors:
        return Findings()
    target = postgres_config.masked_dsn() or f"DSN from {postgres_config.dsn_file}"
    refused = _postgres_refusal(postgres_config)
    if refused is not None:  # one line, within connect_timeout: not a pool retrying per collector
        echo(f"postgres at {target}: FAILED ({refused})")
        return Findings(failures=[f"postgres at {target}"])
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
            reads = f"; {source.reads}" if source.reads else ""
            echo(f"  {source.name}: {source.last_rows} row(s); {_series_summary(samples)}{reads}")
    finally:
        for source in sources:
            source.close()
    return Findings(failures=failures)


def _postgres_refusal(config: PostgresSourceConfig) -> str | None:
    """Why one connection, as the collectors' pool would open it, cannot be made (None when
    it can): libpq's connect_timeout bounds it."""
    try:
        with psycopg.connect(config.conninfo(), **config.connect_kwargs()):
            return None
    except psycopg.Error as error:
        reason = "auth" if postgres.is_auth_failure(error) else "connection"
        return f"{reason}: {_first_line(error)}"


def _native_readers(config: Config, echo: Echo, unreachable: set[str]) -> Findings:
    """Each native reader's Redis holds some record of its system (a key its reader reads)."""
    native = config.sources.native
    findings = Findings()
    if native is None:
        return findings
    for name, reader in native.enabled_by_name().items():
        connection = reader.redis or config.sources.default_redis() or RedisConnectionConfig()
        target = connection.masked_url()
        if target in unreachable | findings.unreachable:  # named FAILED above
            continue
        globs = reader.record_globs()
        try:
            found = _any_key(connection, globs)
        except redis.RedisError as error:
            reason = f"{redis_error_reason(error)}: {_first_line(error)}"
            echo(f"native {name} at {target}: FAILED ({reason})")
            findings.add(Findings(failures=[f"redis at {target}"], unreachable={target}))
            continue
        findings.add(_reader_commands(name, reader, connection, echo))
        if isinstance(reader, CeleryReaderConfig):
            findings.add(_celery_watched(reader, connection, echo, target))
        if found is None:
            echo(f"native {name} at {target}: a record found is not checked (a cluster)")
        elif found:
            echo(f"native {name} at {target}: records found ({printable(found)})")
        else:
            echo(f"native {name} at {target}: no record of {reader.system} found")
            findings.warnings.append(
                f"native reader {name} at {target}: nothing to read, no key matches "
                f"{', '.join(printable(glob) for glob in globs)}: {name} has not run against "
                "this database (the wrong database number?) or its records are elsewhere"
            )
    return findings


def _reader_commands(
    name: str, reader: ReaderConfig, connection: RedisConnectionConfig, echo: Echo
) -> Findings:
    """Each command the reader will send, tried under the configured user; the refused ones
    named with what they need: a failure, or a warning for one that costs one figure only."""
    findings = Findings()
    if connection.is_cluster:
        return findings
    target = connection.masked_url()
    globs = [glob for glob in reader.acl_read_keys() if key_of(glob) is not None]
    glob = globs[0] if globs else "*"
    channel = next(iter(reader.acl_channels(connection)), "")
    trials = [(command, glob) for command in reader.commands_sent()]
    trials += [(command, value_glob) for command, value_glob in reader.acl_value_reads()]
    client = connection.connect()
    try:
        for command, key_glob in trials:
            error = _refusal(client, command, key_of(key_glob) or "", channel, reader)
            if error is None:
                continue
            needs = refusal_needs(command, error, key_glob, channel)
            figure = reader.ONE_FIGURE.get(command)
            cost = f"{figure} is not served" if figure else "every read fails"
            line = f"{command.upper().replace('|', ' ')} refused ({_first_line(error)}): {needs}"
            echo(f"native {name} at {target}: {line}; {cost}")
            said = f"native reader {name} at {target}: {line}; {cost}"
            (findings.warnings if figure else findings.failures).append(said)
    finally:
        client.close()
    return findings


def _refusal(
    client: redis.Redis, command: str, key: str, channel: str, reader: ReaderConfig
) -> redis.ResponseError | None:
    """The error refusing one command (NOPERM, an unknown command), None when it runs (an
    error about the key, as WRONGTYPE or a missing stream, is no refusal)."""
    try:
        if command in ("multi", "exec"):  # around another of the reader's reads
            other = next(c for c in reader.commands_sent() if c in COMMAND_TRIALS)
            pipe = client.pipeline(transaction=True)
            pipe.execute_command(*_filled(COMMAND_TRIALS[other], key))  # type: ignore[no-untyped-call]
            pipe.execute(raise_on_error=False)
        elif command == "psubscribe":
            pubsub = client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.psubscribe(channel)
                pubsub.get_message(timeout=1.0)  # the refusal comes as the reply
            finally:
                pubsub.close()
        elif command in COMMAND_TRIALS:
            client.execute_command(*_filled(COMMAND_TRIALS[command], key))  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError as error:
        return error
    except redis.ResponseError as error:
        text = str(error).lower()
        refused = text.startswith("unknown command") or "unknown subcommand" in text
        return error if refused or "noperm" in text else None
    return None


def _filled(words: tuple[str, ...], key: str) -> list[str]:
    return [key if word == "{key}" else word for word in words]


def _celery_watched(
    settings: CeleryReaderConfig, connection: RedisConnectionConfig, echo: Echo, target: str
) -> Findings:
    """The Celery reader, read as serve reads it for CELERY_WATCH seconds: what it found of
    the workers, and what it says it cannot tell."""
    from exporter.sources.readers.celery import CeleryReader
    from exporter.sources.readers.framework import ReadDeadline, ReaderError, Signals

    findings = Findings()
    reader = CeleryReader(settings, connection, CELERY_WATCH / 2)
    said: dict[str, None] = {}
    try:
        until = time.monotonic() + CELERY_WATCH
        while True:
            signals = Signals(source="native:celery", deadline=ReadDeadline.starting_now(5.0))
            reader.read(signals)
            said.update(dict.fromkeys(w for w in (signals.silent, signals.caveat) if w))
            if time.monotonic() >= until:
                break
            time.sleep(0.5)
    except (redis.RedisError, ReaderError) as error:
        echo(f"native celery at {target}: FAILED ({_first_line(error)})")
        return Findings(failures=[f"redis at {target}"])
    finally:
        reader.close()
    workers = reader.workers_inspected()
    for hostname, (queues, slots, routed) in sorted(workers.items()):
        served = ", ".join(printable(q) for q in queues or []) or "?"
        echo(f"  celery worker {printable(hostname)}: queues {served}; slots {slots}")
        if queues and len(queues) > 1 and not routed:
            findings.warnings.append(
                f"celery worker {printable(hostname)} consumes several queues and its "
                "task_routes cannot be read (a function or a class): its tasks' queue is told "
                "only by task-sent events (task_send_sent_event = True on producers) or one "
                "queue per worker; else they count under "
                f'queue="{printable(settings.unknown_queue)}"'
            )
    if settings.inspect and not workers:
        echo(f"  celery: no worker answered Celery's inspection within {CELERY_WATCH:g} s")
    findings.warnings += [f"native celery at {target}: {text}" for text in said]
    return findings


def _any_key(connection: RedisConnectionConfig, globs: list[str]) -> str | None:
    """A key matching one of the globs ("" when none is, None on a cluster: not checked).
    At most RECORD_SCANS SCANs of COUNT 1000 per glob; a database larger than that with no
    match found counts as found (nothing is claimed that was not seen)."""
    if connection.is_cluster or not globs:
        return None
    client = connection.connect()
    try:
        for glob in globs:
            cursor, scans = 0, 0
            while True:
                cursor, keys = client.scan(cursor, match=glob, count=1000)
                scans += 1
                if keys:
                    return _text(keys[0])
                if cursor == 0:
                    break
                if scans >= RECORD_SCANS:
                    return f"not searched past {RECORD_SCANS * 1000} keys"
    finally:
        client.close()
    return ""


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
