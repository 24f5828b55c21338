"""Which alert can fire for which queue system, each "fires" proven by promtool on the series
that system serves (alerts/tests/recorded/<case>.json, alerts/recorded.py).

Per alert a scenario takes one system's recording and either builds a proof, the series the
alert reads under the names and labels the system serves them with, its values scripted so
the alert fires, and a counter-case where it must stay silent, or names what the system does
not serve that the alert needs. `python -m alerts` writes the proofs as promtool tests
(alerts/tests/systems/<case>.test.yml) and the table of docs/alerts.md from the same scenarios,
so a cell says "fires" only where a test proves it.

A scenario needs the series of one queue from several metrics (the pending depth and the
workers, say). It takes them as recorded for that queue, or else one recorded for another of
the system's queues under the same label names, given this queue's labels: the run chose
which queues had workers, the system decides whether workers are served per queue. A series
under a queue the system serves no depth for (Sidekiq's counters of all queues as one) is not
moved onto a real queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from alerts.alerting import alerting_rules
from alerts.config import DEFAULTS
from alerts.recorded import RECORD_ALL, Recording, record_command

# The systems as the exporter names them (the `system` label), and as people do.
SYSTEMS: tuple[tuple[str, str], ...] = (
    ("attune", "Attune"),
    ("orchestrata", "Orchestrata"),
    ("runnerq", "Runner-Q"),
    ("rq", "RQ"),
    ("celery", "Celery"),
    ("bullmq", "BullMQ"),
    ("bull", "Bull"),
    ("bee_queue", "Bee-Queue"),
    ("sidekiq", "Sidekiq"),
    ("arq", "arq"),
    ("dramatiq", "Dramatiq"),
    ("huey", "Huey"),
    ("saq", "SAQ"),
    ("pgboss", "pg-boss"),
    ("graphile_worker", "graphile-worker"),
    ("procrastinate", "Procrastinate"),
    ("resque", "Resque"),
    ("taskiq", "Taskiq"),
    ("django_q", "django-q2"),
    ("pgqueuer", "PgQueuer"),
    ("oban", "Oban"),
    ("django_tasks", "Django tasks"),
)
# Why a system has no recording yet (every system has one).
NOT_RECORDED: dict[str, str] = {}

# What a scenario misses, short for the table's cells; the legend says it in full.
REASONS: dict[str, str] = {
    "pending": "no pending depth: the system's queues are not served by state",
    "age": "no oldest-item age: the system records no enqueue time the exporter can read",
    "dead letters": "no dead-letter depth or count: the system keeps no dead-letter set, or it "
    "is not a queue's",
    "no limit": "no queue_max_depth: the system has no depth limit",
    "no due": "no queue_scheduled_due: the system keeps no due times the exporter reads",
    "no stats": "no queue_stats_age_seconds: only Attune's statistics rows have an age",
    "no failures": "no failed-job count per queue",
    "no active": "no active depth per queue",
    "no finishes": "no count of finished jobs per queue (none, or all queues as one)",
    "no leases": "no queue_leases_expired: the system has no leases with deadlines",
    "no workers": "no queue_workers: the system records no live workers the exporter reads",
    "workers not per queue": "queue_workers without a queue label: the system does not record "
    "which queues a worker serves",
    "no slots": "no queue_worker_utilization_ratio: the system does not say its workers' slots "
    "(no slot count is made up)",
    "nothing to tell": "neither a count of finished jobs per queue nor the oldest item's age: "
    "nothing tells a stalled queue from a busy one",
    "no key groups": "no key groups: the system is read natively or from PostgreSQL",
    "no consumer group": "no stream read by a consumer group: the system's events are not a "
    "queue-exporter event stream",
    "no events": "no events read: the system is sampled, not followed",
}

# Every window and `for` has passed by then; a counter stepped at 31m is within every
# increase() window.
EVAL = "35m"
LENGTH = 40  # samples, one a minute
EXPORTER = {"job": "queue-exporter", "instance": "a:9839"}
# The labels each recording rule drops on its way to a queue's series (alerts/recording.py).
_COUNTER = ("job_type", "priority", "error_type", "reason")
DROPPED: dict[str, tuple[str, ...]] = {
    "queue_depth": ("priority", "state"),
    "queue_oldest_age_seconds": ("priority", "state"),
    "queue_workers": ("state",),
    "queue_jobs_completed_total": _COUNTER,
    "queue_jobs_failed_total": _COUNTER,
    "queue_jobs_retried_total": _COUNTER,
    "queue_jobs_dead_lettered_total": ("job_type", "priority"),
}

Labels = dict[str, str]


@dataclass(frozen=True)
class Input:
    name: str
    labels: Labels
    values: str

    def series(self) -> dict[str, str]:
        shown = {**EXPORTER, **{k: v for k, v in self.labels.items() if v != ""}}
        text = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(shown.items()))
        return {"series": f"{self.name}{{{text}}}", "values": self.values}


@dataclass(frozen=True)
class Proof:
    """Input series where the alert fires (carrying `by`) and where it must not."""

    fire: tuple[Input, ...]
    quiet: tuple[Input, ...]
    by: Labels


@dataclass(frozen=True)
class Missing:
    reason: str  # a key of REASONS


Outcome = Proof | Missing


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _key(name: str, labels: Labels) -> Labels:
    """The labels a queue's recorded series keeps of a series of `name`."""
    dropped = DROPPED.get(name, ())
    return {k: v for k, v in labels.items() if k not in dropped and v != ""}


class Served:
    """One recording, as the scenarios ask it."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.system = recording.system

    def all(self, name: str, **labels: str) -> list[Labels]:
        return [
            found
            for found in self.recording.of(name)
            if all(found.get(k) == v for k, v in labels.items())
        ]

    def first(self, name: str, **labels: str) -> Labels | None:
        found = self.all(name, **labels)
        return found[0] if found else None

    def beside(
        self, anchor: tuple[str, Labels], name: str, **labels: str
    ) -> tuple[Labels | None, str]:
        """A series of `name` (with `labels`) for the anchor's queue, and why not (a reason
        key, or "" when found): recorded for it, or recorded for another of the system's real
        queues under the same label names and given the anchor's (module docstring)."""
        anchor_name, anchor_labels = anchor
        wanted = _key(anchor_name, anchor_labels)
        candidates = self.all(name, **labels)
        for candidate in candidates:
            if _key(name, candidate) == wanted:
                return candidate, ""
        real_queues = [_key(anchor_name, labels) for labels in self.recording.of(anchor_name)]
        for candidate in candidates:
            key = _key(name, candidate)
            if key.keys() == wanted.keys() and key in real_queues:
                return {**candidate, **wanted}, ""
        return None, "not per queue" if candidates else "none"


def _queue(labels: Labels) -> Labels:
    return {"system": labels["system"], "queue": labels["queue"]}


Scenario = Callable[[Served], Outcome]


def backlog_growing(s: Served) -> Outcome:
    depth = s.first("queue_depth", state="pending")
    if depth is None:
        return Missing("pending")
    return Proof(
        (Input("queue_depth", depth, f"0+10x{LENGTH}"),),
        (Input("queue_depth", depth, f"500x{LENGTH}"),),  # deep, but not growing
        _queue(depth),
    )


def oldest_too_old(s: Served) -> Outcome:
    age = s.first("queue_oldest_age_seconds", state="pending")
    if age is None:
        return Missing("age")
    name = "queue_oldest_age_seconds"
    return Proof(
        (Input(name, age, f"0+60x{LENGTH}"),), (Input(name, age, f"30x{LENGTH}"),), _queue(age)
    )


def dead_letter_growing(s: Served) -> Outcome:
    depth = s.first("queue_depth", state="dead_letter")
    if depth is not None:
        growing, flat = f"0+1x{LENGTH}", f"5x{LENGTH}"
        return Proof(
            (Input("queue_depth", depth, growing),),
            (Input("queue_depth", depth, flat),),
            _queue(depth),
        )
    name = "queue_jobs_dead_lettered_total"
    count = s.first(name)
    if count is None:
        return Missing("dead letters")
    return Proof(
        (Input(name, count, f"0+1x{LENGTH}"),), (Input(name, count, f"0x{LENGTH}"),), _queue(count)
    )


def _capacity(full: str, calm: str) -> Scenario:
    def scenario(s: Served) -> Outcome:
        limit = s.first("queue_max_depth")
        if limit is None:
            return Missing("no limit")
        depth, _ = s.beside(("queue_max_depth", limit), "queue_depth", state="pending")
        if depth is None:
            return Missing("pending")
        cap = Input("queue_max_depth", limit, f"100x{LENGTH}")
        return Proof(
            (cap, Input("queue_depth", depth, f"{full}x{LENGTH}")),
            (cap, Input("queue_depth", depth, f"{calm}x{LENGTH}")),
            _queue(limit),
        )

    return scenario


def scheduled_overdue(s: Served) -> Outcome:
    due = s.first("queue_scheduled_due")
    if due is None:
        return Missing("no due")
    name = "queue_scheduled_due"
    return Proof(
        (Input(name, due, f"3x{LENGTH}"),), (Input(name, due, f"0x{LENGTH}"),), _queue(due)
    )


def stats_stale(s: Served) -> Outcome:
    stats = s.first("queue_stats_age_seconds")
    if stats is None:
        return Missing("no stats")
    depth, _ = s.beside(("queue_stats_age_seconds", stats), "queue_depth", state="pending")
    if depth is None:
        return Missing("pending")
    aging = Input("queue_stats_age_seconds", stats, f"0+60x{LENGTH}")
    return Proof(
        (aging, Input("queue_depth", depth, f"5x{LENGTH}")),
        (aging, Input("queue_depth", depth, f"0x{LENGTH}")),  # an idle queue's row may rest
        _queue(stats),
    )


def failure_ratio(s: Served) -> Outcome:
    failed = s.first("queue_jobs_failed_total")
    if failed is None:
        return Missing("no failures")
    done, _ = s.beside(("queue_jobs_failed_total", failed), "queue_jobs_completed_total")
    if done is None:
        name = "queue_jobs_failed_total"
        return Proof(
            (Input(name, failed, f"0+30x{LENGTH}"),),
            (Input(name, failed, f"0x{LENGTH}"),),
            _queue(failed),
        )
    return Proof(
        (
            Input("queue_jobs_failed_total", failed, f"0+30x{LENGTH}"),
            Input("queue_jobs_completed_total", done, f"0+30x{LENGTH}"),
        ),
        (
            Input("queue_jobs_failed_total", failed, f"0+1x{LENGTH}"),
            Input("queue_jobs_completed_total", done, f"0+99x{LENGTH}"),
        ),
        _queue(failed),
    )


def _finished(s: Served, anchor: tuple[str, Labels]) -> tuple[str, Labels] | None:
    for name in ("queue_jobs_completed_total", "queue_jobs_failed_total"):
        found, _ = s.beside(anchor, name)
        if found is not None:
            return name, found
    return None


def stuck_active(s: Served) -> Outcome:
    active = s.first("queue_depth", state="active")
    if active is None:
        return Missing("no active")
    finished = _finished(s, ("queue_depth", active))
    if finished is None:
        return Missing("no finishes")
    name, labels = finished
    held = Input("queue_depth", active, f"2x{LENGTH}")
    return Proof(
        (held, Input(name, labels, f"5x{LENGTH}")),
        (held, Input(name, labels, f"0+5x{LENGTH}")),
        _queue(active),
    )


def leases_expired(s: Served) -> Outcome:
    leases = s.first("queue_leases_expired")
    if leases is None:
        return Missing("no leases")
    name = "queue_leases_expired"
    return Proof(
        (Input(name, leases, f"2x{LENGTH}"),), (Input(name, leases, f"0x{LENGTH}"),), _queue(leases)
    )


def no_workers(s: Served) -> Outcome:
    depth = s.first("queue_depth", state="pending")
    if depth is None:
        return Missing("pending")
    workers, why = s.beside(("queue_depth", depth), "queue_workers")
    if workers is None:
        return Missing("workers not per queue" if why == "not per queue" else "no workers")
    waiting = Input("queue_depth", depth, f"5x{LENGTH}")
    return Proof(
        (waiting, Input("queue_workers", workers, "1x10 stale")),
        (waiting, Input("queue_workers", workers, f"1x{LENGTH}")),
        _queue(depth),
    )


def not_processing(s: Served) -> Outcome:
    depth = s.first("queue_depth", state="pending")
    if depth is None:
        return Missing("pending")
    anchor = ("queue_depth", depth)
    # Where the system serves them, live workers and no active jobs: the alert fires beside
    # them (hung or misrouted workers), and QueueNoWorkers and QueueJobsStuckActive stay out.
    beside = [Input("queue_depth", depth, f"5x{LENGTH}")]
    workers, _ = s.beside(anchor, "queue_workers")
    if workers is not None:
        beside.append(Input("queue_workers", workers, f"1x{LENGTH}"))
    active, _ = s.beside(anchor, "queue_depth", state="active")
    if active is not None:
        beside.append(Input("queue_depth", active, f"0x{LENGTH}"))
    finished = _finished(s, anchor)
    if finished is not None:
        name, labels = finished
        fire, quiet = Input(name, labels, f"7x{LENGTH}"), Input(name, labels, f"0+1x{LENGTH}")
    else:
        age, _ = s.beside(anchor, "queue_oldest_age_seconds", state="pending")
        if age is None:
            return Missing("nothing to tell")
        name = "queue_oldest_age_seconds"
        fire, quiet = Input(name, age, f"0+60x{LENGTH}"), Input(name, age, f"30x{LENGTH}")
    return Proof((*beside, fire), (*beside, quiet), _queue(depth))


def saturated(s: Served) -> Outcome:
    ratio = s.first("queue_worker_utilization_ratio")
    if ratio is None:
        return Missing("no slots")
    name = "queue_worker_utilization_ratio"
    return Proof(
        (Input(name, ratio, f"0.99x{LENGTH}"),),
        (Input(name, ratio, f"0.5x{LENGTH}"),),
        _queue(ratio),
    )


def source_down(s: Served) -> Outcome:
    up = s.first("queue_exporter_source_up")
    assert up is not None, f"{s.recording.case}: every run serves queue_exporter_source_up"
    name = "queue_exporter_source_up"
    return Proof(
        (Input(name, up, f"0x{LENGTH}"),),
        (Input(name, up, f"1x{LENGTH}"),),
        {"source": up["source"]},
    )


def key_group_unmatched(s: Served) -> Outcome:
    matched = s.first("queue_exporter_keys_matched", system=s.system)
    if matched is None:
        return Missing("no key groups")
    name = "queue_exporter_keys_matched"
    return Proof(
        (Input(name, matched, f"0x{LENGTH}"),),
        (Input(name, matched, f"3x{LENGTH}"),),
        {"system": s.system, "pattern": matched["pattern"]},
    )


def events_lagging(s: Served) -> Outcome:
    lag = s.first("queue_exporter_stream_lag")
    if lag is None:
        return Missing("no consumer group")
    name = "queue_exporter_stream_lag"
    return Proof(
        (Input(name, lag, f"20000x{LENGTH}"),),
        (Input(name, lag, f"5x{LENGTH}"),),
        {"stream": lag["stream"]},
    )


def events_lost(s: Served) -> Outcome:
    lost = s.first("queue_exporter_events_lost_total")
    if lost is None:
        return Missing("no events")
    name = "queue_exporter_events_lost_total"
    return Proof(
        (Input(name, lost, "0x30 5x10"),),
        (Input(name, lost, f"0x{LENGTH}"),),
        {"stream": lost["stream"]},
    )


def invalid_events(s: Served) -> Outcome:
    """Counted from a stream's first invalid entry (a run has none): the stream's labels are
    those of its lost-events counter, declared at zero when the exporter starts reading it."""
    name = "queue_exporter_events_invalid_total"
    invalid = s.first(name)
    if invalid is None:
        lost = s.first("queue_exporter_events_lost_total")
        if lost is None:
            return Missing("no events")
        invalid = {**lost, "reason": "oversized_field"}
    return Proof(
        (Input(name, invalid, "0x30 3x10"),),
        (Input(name, invalid, f"0x{LENGTH}"),),
        {"stream": invalid["stream"]},
    )


def series_overflow(s: Served) -> Outcome:
    """Counted from the first label set refused, under the name of the metric it was refused
    for: here the pending depth (any metric with a system label serves as well)."""
    served = [name for name, labels in s.recording.series if dict(labels).get("system")]
    name = "queue_exporter_series_overflow_total"
    refused = {"metric": "queue_depth" if "queue_depth" in served else served[0]}
    return Proof(
        (Input(name, refused, "0x30 4x10"),), (Input(name, refused, f"0x{LENGTH}"),), refused
    )


def exporter_absent(s: Served) -> Outcome:
    build = s.first("queue_exporter_build_info")
    assert build is not None, f"{s.recording.case}: every run serves queue_exporter_build_info"
    name = "queue_exporter_build_info"
    return Proof((Input(name, build, "1x5"),), (Input(name, build, f"1x{LENGTH}"),), {})


SCENARIOS: dict[str, Scenario] = {
    "QueueBacklogGrowing": backlog_growing,
    "QueueOldestItemTooOld": oldest_too_old,
    "QueueDeadLetterGrowing": dead_letter_growing,
    "QueueNearCapacity": _capacity("90", "10"),
    "QueueAtCapacity": _capacity("100", "50"),
    "QueueScheduledOverdue": scheduled_overdue,
    "QueueStatsStale": stats_stale,
    "QueueJobFailureRatioHigh": failure_ratio,
    "QueueJobsStuckActive": stuck_active,
    "QueueLeasesExpired": leases_expired,
    "QueueNoWorkers": no_workers,
    "QueueNotProcessing": not_processing,
    "QueueWorkersSaturated": saturated,
    "QueueExporterSourceDown": source_down,
    "QueueExporterKeyGroupUnmatched": key_group_unmatched,
    "QueueExporterEventsLagging": events_lagging,
    "QueueExporterEventsLost": events_lost,
    "QueueExporterInvalidEvents": invalid_events,
    "QueueExporterSeriesOverflow": series_overflow,
    "QueueExporterAbsent": exporter_absent,
}


def outcomes(recording: Recording) -> dict[str, Outcome]:
    served = Served(recording)
    return {name: scenario(served) for name, scenario in SCENARIOS.items()}


# -- promtool tests -----------------------------------------------------------------------------


def _check(alert: str, by: Labels | None) -> dict[str, Any]:
    labels = ", ".join(sorted(by or {}))
    firing = f'ALERTS{{alertname="{alert}",alertstate="firing"}}'
    # an empty label is no label to Prometheus (Sidekiq's counters name no queue)
    shown = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted((by or {}).items()) if v)
    return {
        "expr": f"count by ({labels}) ({firing})",
        "eval_time": EVAL,
        "exp_samples": [] if by is None else [{"labels": "{" + shown + "}", "value": 1}],
    }


def _where(by: Labels) -> str:
    return ", ".join(f"{k}={v}" for k, v in by.items()) or "the exporter"


def promtool_tests(recording: Recording, group_order: list[str]) -> dict[str, Any]:
    tests = []
    for alert, outcome in outcomes(recording).items():
        if isinstance(outcome, Missing):
            continue
        for inputs, by, what in (
            (outcome.fire, outcome.by, "fires"),
            (outcome.quiet, None, "stays silent"),
        ):
            tests.append(
                {
                    "name": f"{alert} {what} for {_where(outcome.by)}",
                    "interval": "1m",
                    "input_series": [item.series() for item in inputs],
                    "promql_expr_test": [_check(alert, by)],
                }
            )
    return {
        "rule_files": ["../../queue-exporter.rules.yml"],
        "evaluation_interval": "1m",
        "group_eval_order": group_order,
        "tests": tests,
    }


def render_tests(recording: Recording, group_order: list[str]) -> str:
    header = (
        f"# Generated by `python -m alerts` from alerts/systems.py and the series "
        f"{recording.case}\n# served in its {recording.source} run "
        f"(alerts/tests/recorded/{recording.case}.json). Do not edit.\n"
    )
    body: str = yaml.safe_dump(promtool_tests(recording, group_order), sort_keys=False, width=1_000)
    return header + body


# -- the table ----------------------------------------------------------------------------------


def _cell(results: dict[str, Outcome]) -> str:
    """`results`: case -> outcome of one alert for one system's recordings."""
    missing = {case: o.reason for case, o in results.items() if isinstance(o, Missing)}
    if not missing:
        return "fires"
    reasons = sorted(set(missing.values()))
    if len(missing) == len(results):
        return f"n/a ({'; '.join(reasons)})"
    fires = ", ".join(sorted(case for case in results if case not in missing))
    return f"fires on {fires}; n/a on {', '.join(sorted(missing))} ({'; '.join(reasons)})"


def render_table(recordings: list[Recording]) -> str:
    alerts = [alert.name for alert in alerting_rules(DEFAULTS)]
    by_system: dict[str, dict[str, dict[str, Outcome]]] = {}
    for recording in recordings:
        for alert, outcome in outcomes(recording).items():
            by_system.setdefault(recording.system, {}).setdefault(alert, {})[recording.case] = (
                outcome
            )
    cases: dict[str, list[Recording]] = {}
    for recording in recordings:
        cases.setdefault(recording.system, []).append(recording)
    names = [shown for _, shown in SYSTEMS]
    lines = [
        "| alert | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for alert in alerts:
        cells = []
        for system, _ in SYSTEMS:
            if system not in by_system:
                cells.append(f"not recorded ({NOT_RECORDED.get(system, 'no recording')})")
            else:
                cells.append(_cell(by_system[system][alert]))
        lines.append(f"| [{alert}](runbook.md#{alert.lower()}) | " + " | ".join(cells) + " |")
    recorded = [
        f"| {shown} | "
        + (
            ", ".join(f"`{r.case}` ({r.source})" for r in cases[system])
            if system in cases
            else f"not recorded: {NOT_RECORDED.get(system, 'no recording')}"
        )
        + " |"
        for system, shown in SYSTEMS
    ]
    legend = [f"- **{short}**: {meaning}." for short, meaning in REASONS.items()]
    return "\n".join(
        [
            "<!-- Generated by `python -m alerts` from alerts/systems.py and "
            "alerts/tests/recorded/. Do not edit. -->",
            "# Alerts per queue system",
            "",
            "Which alert of `alerts/queue-exporter.rules.yml` can fire for which queue system, "
            "on the series",
            "that system's exporter run served. Each **fires** is proven by promtool: "
            "`alerts/tests/systems/<case>.test.yml`",
            "feeds the rules the series the system served (its names and labels, recorded in",
            "`alerts/tests/recorded/<case>.json`), with values scripted so the alert fires, "
            "and beside it a case",
            "where it must stay silent (`tests/deploy/test_alerts.py` runs them). **n/a** names what "
            "the system does not serve",
            "that the alert needs (the legend below); where the majors of a system differ, "
            "the cell names them.",
            "",
            "A queue's series the system serves for some queue of the run stand for every "
            "queue with the same labels",
            "(the run chose which queues had workers; the system decides whether workers are "
            "per queue).",
            "",
            *lines,
            "",
            "**n/a**, in full:",
            "",
            *legend,
            "",
            "## The recordings",
            "",
            "| system | recorded from (case, run) |",
            "|---|---|",
            *recorded,
            "",
            "`tests/conformance/test_conformance.py` records what each case's defaults run "
            "served that the alerts read",
            f"(`{record_command('<case>')}`; every case: `{RECORD_ALL}`);",
            "the seed systems, on no conformance harness, are recorded from the demo's run "
            f"(`{record_command('<system>', 'demo')}`).",
            "Otherwise each run is compared with its recording: a system that starts or stops "
            "serving a series the",
            "alerts read fails its run, naming the series and the command. Then "
            "`python -m alerts` rewrites this page",
            "and the promtool tests. docs/testing.md has the steps.",
            "",
        ]
    )
