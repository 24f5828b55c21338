"""End to end against a real Prometheus: it scrapes exporters fed by the demo's synthetic
workload (Orchestrata, Runner-Q and the legacy app in Redis, Attune in PostgreSQL, lifecycle
events on both streams), evaluates the generated rules (short windows), and every dashboard
query and recording rule must parse and return data; alerts must reach the firing state when
their condition is made. Also lints a real /metrics exposition with `promtool check metrics`.

Queues the workload does not touch (Orchestrata `ledger` and `emails`, Runner-Q `jobs`) hold
fixed items, so the alerts asserted on them do not depend on the workload's dice.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.config import DEFAULTS, with_short_windows
from alerts.generate import render_rules
from alerts.recording import recording_rules
from exporter.demo import sim_orchestrata, sim_runnerq
from exporter.demo.command import exporter_config
from exporter.demo.workload import Workload
from exporter.output import catalog
from exporter.runtime.app import App
from tests.conftest import parse_exposition, scrape, wait_for
from tests.dashboard_queries import panel_queries
from tests.layouts import iso, runnerq_activity, runnerq_enqueue
from tests.private_redis import free_port
from tests.tools import require, run

SCRAPE_JOB = "queue-exporter"
FAST_RULES = with_short_windows(DEFAULTS, window="30s")
WORKLOAD_RATE = 20.0  # the demo's default
# Orchestrata's depth limit here (the demo's is far higher): `ledger` holds this many items.
MAX_DEPTH = 4
WORKLOAD_THREADS = ("demo-workload", "event-emitter")
# The workload's rarest incidents (a reaper that fails, leases requeued after a worker died)
# happen within ~15-25s of its start; on two busy cores allow much more.
DATA_TIMEOUT = 120

# Panel title or recorded series -> why it cannot have data here. Empty: the workload feeds
# every source and every event family.
NEEDS_SOURCE: dict[str, str] = {}


def _orchestrata_item(client: Any, key: str, time_field: str, at: float) -> None:
    client.rpush(
        key,
        json.dumps(
            {
                "message_id": str(uuid.uuid4()),
                time_field: iso(at),
                "packet": {"type": "task"},
                "reason": "Message expired",
            }
        ),
    )


def _fixed_items(client: Any) -> None:
    """Queues beside the workload's, written as those systems write them: Orchestrata lists
    (`ledger` full at two priorities with an old dead letter, `emails`) and a Runner-Q queue
    `jobs` whose reaper is dead (an expired lease, an overdue scheduled item)."""
    now = time.time()
    for offset in (300, 200, 100):
        _orchestrata_item(client, "orchestrata:queue:ledger:p3", "queued_at", now - offset)
    _orchestrata_item(client, "orchestrata:queue:ledger:p5", "queued_at", now - 20)
    _orchestrata_item(client, "orchestrata:queue:emails:p0", "queued_at", now - 50)
    _orchestrata_item(client, "orchestrata:dlq:ledger", "failed_at", now - 900)
    runnerq_enqueue(client, "jobs", runnerq_activity("send_email", "High", now - 60), now)
    client.zadd("jobs:processing", {f"{uuid.uuid4()}:{{}}": (now - 30) * 1000})
    client.zadd("jobs:scheduled_activities", {f"{uuid.uuid4()}:{{}}": now - 30})
    client.rpush("jobs:dead_letter_queue", json.dumps({"failed_at": iso(now - 600)}))


def _demo_config(redis_url: str, postgres_dsn: str, consumer: str) -> dict[str, Any]:
    """The exporter as `queue-exporter demo` configures it (presets orchestrata, runnerq and
    attune, both event streams, the legacy key group), with a small Orchestrata depth limit
    (so `ledger` is full) and faster stream statistics."""
    raw = exporter_config(redis_url, postgres_dsn, "127.0.0.1:0", 0.2, "warning")
    for group in raw["sources"]["redis"]["key_groups"]:
        if group["system"] == "orchestrata" and "max_depth" in group:
            group["max_depth"] = MAX_DEPTH
    # Replicas sharing the consumer group have distinct names, as pods do.
    raw["sources"]["events"].update(consumer=consumer, stats_interval=1.0)
    # The interval (0.2 s) is also the key sampler's cycle deadline unless one is given: on a
    # loaded host most cycles missed it, their series withdrawn, so rules on them had no data
    raw["sources"]["redis"]["cycle_timeout"] = 5.0
    return raw


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], flags: tuple[str, ...] = ()) -> None:
        """`flags`: more of prometheus' own (--enable-feature=exemplar-storage)."""
        self.port = free_port()
        rules = workdir / "queue-exporter.rules.yml"
        rules.write_text(render_rules(FAST_RULES))
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "scrape_timeout": "1s",
            },
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": targets}]}],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                require("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[list[App]], Prometheus]]:
    started: list[Prometheus] = []

    def start(apps: list[App]) -> Prometheus:
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{app.server.port}" for app in apps])
        started.append(prometheus)
        wait_for(prometheus.ready, timeout=30)
        return prometheus

    yield start
    for prometheus in started:
        prometheus.stop()


@pytest.fixture
def start_workload(
    redis_client: Any, redis_url: str, postgres_dsn: str, run_exporter: Callable[..., App]
) -> Iterator[Callable[[], None]]:
    """The demo's workload, set up beside the fixed items; the test starts it once its
    exporters run. (It asks for run_exporter so that it stops before the exporters do.)"""
    before = set(threading.enumerate())
    workload = Workload(redis_url, postgres_dsn, WORKLOAD_RATE, seed=1)
    stop = threading.Event()
    try:
        workload.check()
        workload.setup()
        _fixed_items(redis_client)
        # Started once the exporters run, the streams do not exist yet, so their groups
        # start at the first event and every event (the rare ones too) is read.
        yield lambda: workload.start(stop)
    finally:
        # The demo's order: the workload stops, its buffered events are sent, its
        # connections close. The fixtures then flush the Redis db and drop the database.
        stop.set()
        workload.join()
        workload.stop_events()
        workload.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.name in WORKLOAD_THREADS]
    assert left == [], f"workload threads still running: {left}"
    assert workload.errors == 0, f"the workload met {workload.errors} server errors"


@pytest.fixture
def exporters(
    redis_url: str,
    postgres_dsn: str,
    run_exporter: Callable[..., App],
    start_workload: Callable[[], None],
) -> list[App]:
    healthy = run_exporter(_demo_config(redis_url, postgres_dsn, "healthy"))
    # A replica whose cardinality cap is tiny: it folds series and counts the overflow.
    # It shares the consumer group with `healthy`: each event is counted by one of them.
    capped = run_exporter(
        {**_demo_config(redis_url, postgres_dsn, "capped"), "limits": {"max_series_per_metric": 2}}
    )
    # A replica whose servers are unreachable: its sources are down and count errors.
    nowhere = f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres"
    blind = run_exporter(_demo_config(f"redis://127.0.0.1:{free_port()}/0", nowhere, "blind"))
    start_workload()
    return [healthy, capped, blind]


def _without_data(prometheus: Prometheus) -> list[str]:
    """Panel queries and recording rules that return nothing (each query must parse)."""
    missing = []
    for query in panel_queries():
        result = prometheus.query(query.expr)  # raises unless Prometheus accepted the query
        if query.panel not in NEEDS_SOURCE and not result:
            missing.append(f"{query.dashboard}: {query.panel}: {query.expr}")
    for rule in recording_rules(FAST_RULES):
        if rule.record not in NEEDS_SOURCE and not prometheus.query(rule.record):
            missing.append(f"recording rule {rule.record}")
    return missing


def test_dashboards_and_rules_against_a_real_prometheus(
    exporters: list[App], redis_client: Any, prometheus_for: Callable[[list[App]], Prometheus]
) -> None:
    prometheus = prometheus_for(exporters)
    blind = f"127.0.0.1:{exporters[2].server.port}"
    # The first scrape lands after ~5s of target discovery; then let rate windows fill.
    wait_for(lambda: len(prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1')) == 3, timeout=60)
    wait_for(lambda: prometheus.query("queue:queue_capacity_used:ratio"), timeout=30)

    # Every panel and recording rule gets data once the workload's rarer incidents happened.
    missing: list[str] = []

    def every_query_has_data() -> bool:
        missing[:] = _without_data(prometheus)
        return not missing

    try:
        wait_for(every_query_has_data, timeout=DATA_TIMEOUT, interval=1.0)
    except AssertionError:
        raise AssertionError("without data:\n" + "\n".join(missing)) from None

    # The dashboards' variables resolve: label_values(<selector>, system|queue).
    selector = '{__name__=~"queue_depth|queue_jobs_enqueued_total", job="queue-exporter"}'
    assert {"orchestrata", "runnerq", "attune", "legacy"} <= set(
        prometheus.api("label/system/values", **{"match[]": selector})
    )
    assert {"billing", "reports", "ledger", "emails", "default", "jobs", "aws.ec2_start"} <= set(
        prometheus.api("label/queue/values", **{"match[]": selector})
    )

    groups = prometheus.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(yaml.safe_load(render_rules(FAST_RULES))["groups"][0]["rules"]) + sum(
        len(g["rules"]) for g in yaml.safe_load(render_rules(FAST_RULES))["groups"][1:]
    )
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert unhealthy == []

    def alerts(name: str, **labels: str) -> list[dict[str, Any]]:
        return [
            dict(item)
            for item in prometheus.api("alerts")["alerts"]
            if item["labels"]["alertname"] == name and labels.items() <= item["labels"].items()
        ]

    def firing(name: str, **labels: str) -> dict[str, Any] | None:
        found = [a for a in alerts(name, **labels) if a["state"] == "firing"]
        return found[0] if found else None

    # Nothing was dead-lettered on ledger since the exporter started: quiet. Then three die.
    assert alerts("QueueDeadLetterGrowing", queue="ledger") == []
    for _ in range(3):
        _orchestrata_item(redis_client, "orchestrata:dlq:ledger", "failed_at", time.time())
    grown = wait_for(lambda: firing("QueueDeadLetterGrowing", queue="ledger"), timeout=30)
    assert grown["labels"]["severity"] == "warning"
    assert grown["labels"]["system"] == "orchestrata"
    assert grown["annotations"]["runbook_url"] == "docs/runbook.md#queuedeadlettergrowing"
    assert "orchestrata/ledger grew by 3 items" in grown["annotations"]["description"]

    # The unreachable replica's sources are down, and only its; the exporter is present. With
    # `for: 0s` a healthy replica's source that misses one deadline on a loaded host (its
    # redis source's is the 0.2 s interval) fires until its next cycle answers: the wait
    # ends when only the blind replica's alerts are firing, and a healthy source that stays
    # down fails it.
    def sources_down() -> dict[str, set[str]]:
        down = alerts("QueueExporterSourceDown")
        assert all(a["labels"]["severity"] == "critical" for a in down), down
        firing_now: dict[str, set[str]] = {}
        for alert in (alert for alert in down if alert["state"] == "firing"):
            firing_now.setdefault(alert["labels"]["instance"], set()).add(alert["labels"]["source"])
        return firing_now

    every_source = {
        "redis",
        "postgres:attune_queue_stats",
        "postgres:attune_executions",
        f"events:{sim_orchestrata.EVENTS_STREAM}",
        f"events:{sim_runnerq.QUEUE}:events_stream",
    }
    wait_for(lambda: sources_down() == {blind: every_source}, timeout=30)
    assert alerts("QueueExporterAbsent") == []
    assert firing("QueueLeasesExpired", queue="jobs") is not None
    # ledger holds 4 items against a limit of 4
    assert firing("QueueNearCapacity", queue="ledger") is not None
    assert firing("QueueAtCapacity", queue="ledger") is not None


def test_the_exposition_passes_promtool_check_metrics(
    redis_url: str,
    postgres_dsn: str,
    run_exporter: Callable[..., App],
    start_workload: Callable[[], None],
) -> None:
    """Every family the workload feeds (queues, Attune, events), overflow included."""
    require("promtool")
    raw = _demo_config(redis_url, postgres_dsn, "linted")
    app = run_exporter({**raw, "limits": {"max_series_per_metric": 3}})
    start_workload()
    # The demo's configuration runs no native reader: a family only one serves is not here.
    wanted = {
        f"{s.name}_bucket" if s.kind == "histogram" else s.name
        for s in catalog.ALL
        if s.name not in catalog.OPT_IN
    }
    exposition = wait_for(
        lambda: (
            (text := scrape(app.server.port))
            and {name for name, _ in parse_exposition(text)} >= wanted
            and text
        ),
        timeout=DATA_TIMEOUT,
    )
    result = run("promtool", "check", "metrics", stdin=exposition)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
