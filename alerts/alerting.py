"""Alerting rules, each with the runbook section it links to (docs/runbook.md is generated from
the same objects, so an alert never points at a missing section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from alerts.config import RulesConfig
from alerts.recording import Names, without

Severity = Literal["critical", "warning", "info"]
QUEUE = "{{ $labels.system }}/{{ $labels.queue }}"
# A stream as the status page names it: its key, and with several Redis sources @<redis_source>
# (one key may live on two servers).
STREAM = "{{ $labels.stream }}{{ with $labels.redis_source }}@{{ . }}{{ end }}"


@dataclass(frozen=True)
class AlertRule:
    name: str
    severity: Severity
    expr: str
    for_: str
    summary: str
    description: str
    # The runbook section: what it means, how to confirm it, what to do.
    meaning: str
    confirm: str
    action: str

    @property
    def anchor(self) -> str:
        """The GitHub-style anchor of the runbook heading `## <name>`."""
        return self.name.lower()


def alerting_rules(config: RulesConfig) -> list[AlertRule]:
    return (
        queue_alerts(config) + job_alerts(config) + worker_alerts(config) + exporter_alerts(config)
    )


def queue_alerts(c: RulesConfig) -> list[AlertRule]:
    n = Names(c)
    return [
        AlertRule(
            "QueueBacklogGrowing",
            "warning",
            f"{n.backlog} > {c.backlog_min_items} "
            f"and deriv({n.backlog}[{c.backlog_growth_window}]) > 0",
            c.backlog_growth_for,
            f"Backlog of {QUEUE} keeps growing.",
            f"{QUEUE} holds {{{{ $value | humanize }}}} pending items and its backlog has grown "
            f"for {c.backlog_growth_for}.",
            "Jobs arrive faster than workers take them: the queue is falling behind and wait "
            "times will keep rising.",
            "Queues dashboard: *Depth by queue and state* and *Enqueue vs completion rate* for "
            "the queue; the Workers dashboard for busy/idle workers and utilisation.",
            "Add workers or concurrency for the queue, look for a slow dependency in *Execution "
            "time*, or throttle the producer. A burst that ends on its own needs no action.",
        ),
        AlertRule(
            "QueueOldestItemTooOld",
            "warning",
            f"{n.oldest_age} > {c.oldest_age_seconds}",
            c.oldest_age_for,
            f"The oldest pending item of {QUEUE} is too old.",
            f"The head of {QUEUE} has waited {{{{ $value | humanizeDuration }}}}, longer than "
            f"{c.oldest_age_seconds}s.",
            "Nothing has taken the next item for a long time: no worker consumes the queue, "
            "workers are stuck, or the backlog is too deep for the current throughput.",
            "Queues dashboard: *Oldest item age* and *Depth*. A depth that does not move while "
            "the age rises means nobody consumes; a falling depth means workers are catching up.",
            "Check that workers for the queue run and can reach the broker (their logs, "
            "*Workers busy and idle*); restart stuck workers; add capacity if they are all busy.",
        ),
        AlertRule(
            "QueueDeadLetterGrowing",
            "warning",
            # Against the low point of the window rather than delta(): exact counts, and a
            # dead-letter list emptied and refilled within the window still counts.
            f"({n.dead_letter} - min_over_time({n.dead_letter}[{c.dead_letter_window}]) > 0) "
            f"or (sum {without(c, 'job_type', 'priority')} "
            f"(increase(queue_jobs_dead_lettered_total[{c.dead_letter_window}])) > 0)",
            "0m",
            f"Items are being dead-lettered on {QUEUE}.",
            f"The dead-letter queue of {QUEUE} grew by {{{{ $value | humanize }}}} items "
            f"within the last {c.dead_letter_window}.",
            "Jobs were given up on: they expired, exhausted their retries or failed "
            "permanently. Each one is work that did not happen.",
            "Queues dashboard: *Dead-letter depth*; Jobs dashboard: *Failure ratio by error "
            "type* and *Dead letters*. Inspect a few dead-lettered items for their reason.",
            "Fix the cause (a bad deploy, a failing dependency, too short a TTL), then replay "
            "or discard the dead-lettered items with the queue system's own tools.",
        ),
        AlertRule(
            "QueueNearCapacity",
            "warning",
            f"{n.capacity_used} > {c.near_capacity_ratio}",
            c.near_capacity_for,
            f"{QUEUE} is near its depth limit.",
            f"{QUEUE} holds {{{{ $value | humanizePercentage }}}} of its configured maximum "
            f"depth; enqueues will be refused once it is full.",
            "The queue has a backpressure limit (e.g. Orchestrata's max depth) and is close to "
            "it; producers will soon be told the queue is full.",
            "Queues dashboard: *Capacity use* and *Depth*; compare *Enqueue vs completion rate*.",
            "Scale the consumers before the limit is reached, or raise the limit if the backlog "
            "is expected (a planned batch).",
        ),
        AlertRule(
            "QueueAtCapacity",
            "critical",
            f"{n.capacity_used} >= {c.at_capacity_ratio}",
            c.at_capacity_for,
            f"{QUEUE} is full: enqueues are refused.",
            f"{QUEUE} holds {{{{ $value | humanizePercentage }}}} of its configured maximum "
            f"depth; producers get backpressure errors and work is being lost or delayed.",
            "The queue reached its backpressure limit; new work is rejected.",
            "Queues dashboard: *Capacity use* at 100%; producer logs show queue-full errors.",
            "Add consumers now; if consumers are healthy but cannot keep up, shed or defer "
            "non-urgent producers. Raise the limit only if memory in Redis allows it.",
        ),
        AlertRule(
            "QueueScheduledOverdue",
            "warning",
            f"{n.scheduled_due} > 0",
            c.scheduled_due_for,
            f"Scheduled items of {QUEUE} are overdue.",
            f"{{{{ $value | humanize }}}} scheduled items of {QUEUE} are past their due time "
            f"and have not been moved to the queue for {c.scheduled_due_for}.",
            "The scheduler that promotes due items (delayed/scheduled sets) is not running or "
            "is failing.",
            "Workers dashboard: *Scheduler health* (processed vs errors); the scheduler's logs.",
            "Restart the scheduler process or the workers that host it; check its Redis access.",
        ),
        AlertRule(
            "QueueStatsStale",
            "warning",
            f"{n.stats_age} > {c.stats_age_seconds} and ({n.backlog} > 0 or {n.active} > 0)",
            c.stats_stale_for,
            f"Attune statistics of {QUEUE} are stale.",
            f"The statistics row of {QUEUE} was last updated {{{{ $value | humanizeDuration }}}} "
            f"ago although the queue holds work.",
            "Attune writes attune.queue_stats as executions move; a busy queue whose row stops "
            "changing means the executor stopped updating it (or stopped working). Idle queues "
            "are not alerted on.",
            "Queues dashboard: *Depth* and the stats age; in PostgreSQL, "
            "`SELECT * FROM attune.queue_stats WHERE action_id = ...`.",
            "Check the Attune executor service and its database connection; restart it.",
        ),
    ]


def job_alerts(c: RulesConfig) -> list[AlertRule]:
    n = Names(c)
    return [
        AlertRule(
            "QueueJobFailureRatioHigh",
            "warning",
            f"{n.failure_ratio} > {c.failure_ratio} and {n.finished_rate} > {c.failure_min_rate}",
            c.failure_for,
            f"Many jobs of {QUEUE} fail.",
            f"{{{{ $value | humanizePercentage }}}} of the jobs of {QUEUE} finished with a "
            f"failure over the last {c.rate_window} (threshold "
            f"{{{{ {c.failure_ratio} | humanizePercentage }}}}).",
            "A large share of jobs fail for good: a bug, bad input or a failing dependency. "
            "Attempts that were retried are not counted as failures (their share is "
            f"{n.retry_ratio}).",
            "Jobs dashboard: *Failure ratio by error type* tells retryable from permanent "
            "failures and timeouts; narrow it with the job_type variable.",
            "Look at the failing handler's logs; roll back a recent deploy; fix or isolate the "
            "failing dependency. Retryable failures may recover by themselves.",
        ),
        AlertRule(
            "QueueJobsStuckActive",
            "warning",
            f"{n.active} > 0 and {n.finished_rate} == 0",
            c.stuck_active_for,
            f"Active jobs of {QUEUE} are not finishing.",
            f"{{{{ $value | humanize }}}} jobs of {QUEUE} are active but none completed or "
            f"failed for {c.stuck_active_for}.",
            "Jobs were taken but nothing finishes: workers hang, or died holding their jobs.",
            "Queues dashboard: *Depth* with state=active; Jobs dashboard: *Throughput*; "
            "Workers dashboard: busy workers that stay busy.",
            "Find the hung workers (thread dumps, logs) and restart them; check that "
            "the reaper requeues abandoned jobs.",
        ),
        AlertRule(
            "QueueLeasesExpired",
            "warning",
            f"{n.leases_expired} > 0",
            c.leases_expired_for,
            f"Jobs of {QUEUE} hold expired leases.",
            f"{{{{ $value | humanize }}}} in-flight jobs of {QUEUE} are past their lease "
            f"deadline and have not been requeued for {c.leases_expired_for}.",
            "Workers took jobs and stopped extending their leases (crashed or hung), and the "
            "reaper has not requeued them.",
            "Workers dashboard: *Reaper health*; the processing set in Redis "
            "(`ZRANGEBYSCORE <queue>:processing -inf <now_ms>`).",
            "Make sure the reaper runs (it lives in the workers); restart crashed workers.",
        ),
    ]


def no_workers(c: RulesConfig) -> str:
    """The queue's workers, once seen, are all gone (QueueNoWorkers's condition)."""
    n = Names(c)
    return f"({n.workers} == 0 or (max_over_time({n.workers}[{c.workers_lookback}]) unless {n.workers}))"


def not_processing(c: RulesConfig) -> str:
    """Work waited for the whole window and nothing processed it: nothing finished, where
    finished jobs are counted, else the head did not move while the backlog did not shrink.
    Left to the alert that says more: QueueJobsStuckActive while jobs are active,
    QueueNoWorkers while the queue's workers are gone."""
    n, w = Names(c), c.stalled_window
    head_still = (
        f"(deriv({n.oldest_age}[{w}]) > {c.stalled_age_growth} "
        f"and deriv({n.backlog}[{w}]) >= 0 unless {n.finished_rate})"
    )
    return (
        f"(min_over_time({n.backlog}[{w}]) > 0 "
        f"and (max_over_time({n.finished_rate}[{w}]) == 0 or {head_still})) "
        f"unless {n.active} > 0 unless {no_workers(c)}"
    )


def worker_alerts(c: RulesConfig) -> list[AlertRule]:
    n = Names(c)
    return [
        AlertRule(
            "QueueNoWorkers",
            "critical",
            f"{n.backlog} > 0 and {no_workers(c)}",
            c.no_workers_for,
            f"{QUEUE} has work but no workers.",
            f"{QUEUE} holds {{{{ $value | humanize }}}} pending items and no worker has sent a "
            f"heartbeat for it; workers were seen within {c.workers_lookback}.",
            "Every worker of the queue is gone (crashed, scaled to zero, cannot reach Redis); "
            "nothing will be processed. Only systems that record their workers per queue can "
            "say so; for the others QueueNotProcessing catches the same outage "
            "(docs/alerts.md).",
            "Workers dashboard: *Workers busy and idle*; the workers' deployment and logs.",
            "Start or scale the workers; check their connection to the broker.",
        ),
        AlertRule(
            "QueueNotProcessing",
            "critical",
            not_processing(c),
            c.not_processing_for,
            f"{QUEUE} has work but nothing processes it.",
            f"{QUEUE} has held at least {{{{ $value | humanize }}}} pending items for "
            f"{c.stalled_window} and none was processed.",
            "Work waits and nothing takes it: no worker consumes the queue (for systems that "
            "record no workers per queue this is the only sign of it), or the workers cannot "
            "reach it. Nothing finished in the window where the system counts finished jobs; "
            "where it does not, the oldest pending item stayed at the head (its age grew "
            f"by more than {c.stalled_age_growth} s a second) and the backlog did not shrink. "
            "An idle empty queue, or one holding only scheduled work, does not fire; nor does a "
            "queue with active jobs (QueueJobsStuckActive) or whose workers are gone "
            "(QueueNoWorkers).",
            "Queues dashboard: *Depth* and *Oldest item age* (a flat depth and an age rising "
            "with the clock); Jobs dashboard: *Throughput* at zero; the workers' deployment.",
            "Start or scale the workers for the queue; check that they consume this queue "
            "(routing, queue names) and can reach the broker or database.",
        ),
        AlertRule(
            "QueueWorkersSaturated",
            "warning",
            f"{n.utilization} > {c.saturation_ratio}",
            c.saturation_for,
            f"Workers of {QUEUE} are saturated.",
            f"The workers of {QUEUE} use {{{{ $value | humanizePercentage }}}} of their slots "
            f"for {c.saturation_for}.",
            "All worker slots are busy: anything more that arrives waits. Only systems whose "
            "workers say their slots serve the ratio (RQ, Resque: one job per worker; Sidekiq, "
            "Celery: their concurrency; Oban: each queue's local_limit; event heartbeats: their "
            "capacity); none is made up where a "
            "system does not say them (docs/alerts.md).",
            "Workers dashboard: *Utilisation*; Queues dashboard: is the backlog growing and "
            "*Wait time* rising?",
            "Add workers or slots; look for slower executions that hold slots longer.",
        ),
    ]


def exporter_alerts(c: RulesConfig) -> list[AlertRule]:
    return [
        AlertRule(
            "QueueExporterSourceDown",
            "critical",
            "queue_exporter_source_up == 0",
            c.source_down_for,
            "queue-exporter cannot read its {{ $labels.source }} source.",
            "The {{ $labels.source }} source of {{ $labels.job }} has failed every sample for "
            f"{c.source_down_for}; its queue metrics are missing and queue alerts cannot fire.",
            "The exporter cannot reach or read Redis/PostgreSQL; it withdraws that source's "
            "series, so every queue alert on them is blind.",
            "Exporter dashboard: *Sources up* and *Source errors by reason*; the exporter's "
            "logs and `/readyz`.",
            "Fix the connection (URL, credentials, network policy, TLS); reason `timeout` is "
            "a backend that accepted the connection but did not answer within the deadline (a "
            "hung server or proxy, or a cycle that needs a longer `cycle_timeout`); reason "
            "`leader_lease` is leader election whose lease no replica can hold (its Redis down, "
            "read-only, refusing the user or holding another type under the key: the log names "
            "which). The source recovers within one sample interval once the backend answers.",
        ),
        AlertRule(
            "QueueExporterKeyGroupUnmatched",
            "warning",
            # max over replicas: a follower reports no key groups, the leader's count decides.
            f"max {without(c)} (queue_exporter_keys_matched) == 0",
            c.key_group_unmatched_for,
            "Key group {{ $labels.pattern }} ({{ $labels.system }}) matches no Redis keys.",
            "The key group {{ $labels.pattern }} of {{ $labels.system }} has matched no keys "
            f"for {c.key_group_unmatched_for}; its queues report nothing, which reads like "
            "empty queues.",
            "The exporter reaches Redis but finds no key of the group's pattern: a typo in the "
            "pattern or preset params, the wrong Redis database or prefix, or a system that has "
            "not created its queues yet. Its queue alerts cannot fire. In layouts that scan for "
            "their keys (Orchestrata, Runner-Q, custom patterns) it also means every queue of "
            "the group stayed empty, since Redis deletes an empty list or zset.",
            "The exporter's status page (`/`) lists each key group with the keys it matched and "
            "the warning it logged; `queue-exporter check-config --connect` shows the keys a "
            "pattern finds; compare with `redis-cli --scan --pattern '<glob>'` on the database "
            "the URL names.",
            "Fix the pattern, preset params or the URL's database. A queue system that is not "
            "deployed yet, or a group whose queues are idle by design (a dead-letter list that "
            "stays empty), needs no action: drop the preset or its group, or silence the alert "
            "for that pattern.",
        ),
        AlertRule(
            "QueueExporterEventsLagging",
            "warning",
            f"max {without(c)} (queue_exporter_stream_lag) > {c.stream_lag_entries}",
            c.stream_lag_for,
            f"queue-exporter falls behind on {STREAM}.",
            "The consumer group {{ $labels.group }} is {{ $value | humanize }} entries behind "
            f"on {STREAM} for {c.stream_lag_for}.",
            "Events arrive faster than the exporter reads them; event metrics are late and, "
            "if the stream is trimmed, events will be lost.",
            "Exporter dashboard: *Stream lag* and *Events read*; the exporter's CPU.",
            "Give the exporter more CPU or run more replicas in the same consumer group.",
        ),
        AlertRule(
            "QueueExporterEventsLost",
            "warning",
            f"sum {without(c)} (increase(queue_exporter_events_lost_total[{c.events_lost_window}])) > 0",
            "0m",
            f"queue-exporter lost events on {STREAM}.",
            f"{{{{ $value | humanize }}}} entries of {STREAM} were gone before the "
            f"exporter read them in the last {c.events_lost_window}; event counters undercount.",
            "The stream's MAXLEN trimmed entries the exporter had not consumed (it lagged or "
            "was down), or Redis lost them (restarted without its data, or from an older copy). "
            'For `stream="native:celery"`: the Celery reader\'s event subscription was lost '
            "(its connection dropped) and redone; the events published meanwhile are gone.",
            "Exporter dashboard: *Lost events* and *Stream lag*; the exporter's log names the "
            "cause (`trimmed`, `data_lost`, `deleted_pending`, `resubscribed`).",
            "`trimmed`: raise the stream's MAXLEN or make the exporter keep up (see "
            "QueueExporterEventsLagging). `data_lost`: look at Redis's persistence and restarts. "
            "`resubscribed`: look at the network and Redis restarts between the exporter and Redis.",
        ),
        AlertRule(
            "QueueExporterInvalidEvents",
            "info",
            f"sum {without(c)} (increase(queue_exporter_events_invalid_total[{c.events_invalid_window}])) > 0",
            "0m",
            f"Invalid events on {STREAM}.",
            f"{{{{ $value | humanize }}}} entries of {STREAM} were invalid "
            "({{ $labels.reason }}) in the last " + c.events_invalid_window + ".",
            "A producer writes entries the exporter cannot read (missing fields, unknown "
            "version, a Runner-Q activity key of another type); they are counted, acknowledged "
            "and skipped, and never hold up the stream.",
            "Exporter dashboard: *Invalid events by reason*; the exporter's log names a "
            "refused entry id per reason: read it with XRANGE.",
            "Fix the producer's instrumentation to the documented wire format.",
        ),
        AlertRule(
            "QueueExporterSeriesOverflow",
            "warning",
            f"sum {without(c)} (increase(queue_exporter_series_overflow_total[{c.overflow_window}])) > 0",
            "0m",
            "queue-exporter folds series of {{ $labels.metric }}.",
            "{{ $value | humanize }} label sets of {{ $labels.metric }} were refused by the "
            f"cardinality cap in the last {c.overflow_window} and counted in the overflow series.",
            "More distinct queues/job types than the cap allows: some are shown only as "
            "`__overflow__`.",
            "Exporter dashboard: *Series overflow*; count the distinct queue and job_type values.",
            "Raise `limits.max_series_per_metric` if the cardinality is real, or fix the "
            "producer that invents label values (ids in queue names).",
        ),
        AlertRule(
            "QueueExporterAbsent",
            "critical",
            f"absent(queue_exporter_build_info{{{c.exporter_selector}}})",
            c.absent_for,
            "queue-exporter has disappeared.",
            f"No queue-exporter series matching {{{c.exporter_selector}}} for "
            f"{c.absent_for}: every queue alert is blind.",
            "Prometheus has no series from the exporter: it is down, not scraped, or its "
            "target labels changed.",
            "Prometheus' *Targets* page for the exporter's job; the exporter's pod status.",
            "Start the exporter; fix the scrape config or ServiceMonitor; if the job label "
            "differs, set it: `python -m alerts --job NAME --output FILE`, or the chart's "
            "`prometheusRule.job`.",
        ),
    ]
