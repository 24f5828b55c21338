"""`check-config --connect` for key groups: one key sampler cycle per Redis, as serve runs it.

Per key group: the keys matched with a few examples and the series they give. A warning (named
on a line of its own for the verdict) for a key group that matched nothing, a key of another
Redis type than its group's (the type found named), a database with no keys at all, queues
found in Redis but not configured (a group's `select` left them out), and keys a group could
not read. A Redis that cannot be reached is a failure, named once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import redis

from exporter.core.printable import printable
from exporter.output.catalog import BY_NAME
from exporter.output.health import KeyGroupReport
from exporter.output.samples import LabelValues, SampleSet
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason
from exporter.sources.probe import Echo, Findings, ProbeContext, first_line, text
from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.redis_keys.groups import KeyGroup
from exporter.sources.redis_keys.sampler import RedisKeySampler, redis_samplers
from exporter.sources.redis_keys.types import REASON_WORDS
from exporter.sources.source import DeadlineExceeded, sample_within_deadline

SHOWN_SERIES = 5


def probe(
    redis: RedisSourceConfig | list[RedisSourceConfig] | None, context: ProbeContext
) -> Findings:
    """Each Redis with key groups, sampled once: what its groups matched, and what is wrong."""
    findings = Findings()
    for sampler in redis_samplers(redis, context.sample_interval):
        findings.add(_sampler_key_groups(sampler, context.echo))
    return findings


def _sampler_key_groups(sampler: RedisKeySampler, echo: Echo) -> Findings:
    target = sampler.config.masked_url()
    try:
        report = sample_within_deadline(sampler)
    except Exception as error:
        reason = "timeout" if isinstance(error, DeadlineExceeded) else redis_error_reason(error)
        echo(f"redis keys at {target}: FAILED ({reason}: {first_line(error)})")
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
    depths = _values(report.samples, "queue_depth")
    ages = _values(report.samples, "queue_oldest_age_seconds")
    groups = report.key_groups or []
    for group in groups:
        for line in _key_group_lines(group, depths, ages):
            echo(f"  {line}")
        findings.warnings += _key_group_warnings(sampler, group)
    if not empty:
        findings.warnings += _unmatched_groups(sampler.config.key_groups, groups)
    return findings


def _unmatched_groups(groups: Sequence[KeyGroup], reports: list[KeyGroupReport]) -> list[str]:
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
        found = text(client.type(key))
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


def _values(samples: SampleSet, name: str) -> dict[LabelValues, float]:
    # labels[:width]: the queue labels, without the redis_source of several Redis sources
    width = len(BY_NAME[name].labels)
    for spec, series in samples.metrics():
        if spec.name == name:
            return {labels[:width]: value for labels, value in series.items()}
    return {}
