"""End to end against a real Prometheus: it scrapes exporters fed by a real Redis workload,
evaluates the generated rules (short windows), and every dashboard query and recording rule
must parse and return data; an alert must reach the firing state when its condition is made.
Also lints a real /metrics exposition with `promtool check metrics`.

Panels and rules whose metrics come from sources this workload does not run are listed in
NEEDS_SOURCE; remove an entry once the e2e workload feeds that source.
"""

from __future__ import annotations

import json
import socket
import subprocess
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
from exporter.app import App
from tests.conftest import scrape, wait_for
from tests.dashboard_queries import panel_queries
from tests.layouts import iso, runnerq_activity, runnerq_enqueue
from tests.tools import require, run

SCRAPE_JOB = "queue-exporter"
FAST_RULES = with_short_windows(DEFAULTS, window="30s")

# Panel title or recorded series -> the source whose metrics it needs.
NEEDS_SOURCE: dict[str, str] = {
    # Queues
    "Concurrency use (active / limit)": "postgres",
    "Statistics age (Attune)": "postgres",
    "Executions by status (Attune)": "postgres",
    "Enqueue vs completion rate": "events or postgres",
    # Jobs: all from lifecycle events
    **{
        title: "events"
        for title in (
            "Throughput by job type",
            "Failure ratio by error type",
            "Jobs started, failed and timed out",
            "Failures by queue",
            "Execution time",
            "Wait time",
            "Total time",
            "p95 execution time by job type",
            "Retries and requeues",
            "Attempts per job",
            "Dead letters",
            "Schedule delay and retry delay",
        )
    },
    # Workers and backend: heartbeats and backend events
    **{
        title: "events"
        for title in (
            "Workers busy and idle",
            "Worker slots busy and free",
            "Utilisation",
            "Dequeue hits vs empty polls",
            "Backend operation latency p95",
            "Reaper health",
            "Reaper cycle duration",
            "Scheduler health",
            "Scheduler cycle duration",
            "Idempotency conflicts and reuses",
            "Idempotency check latency",
        )
    },
    # Exporter: the event consumer's own metrics
    **{
        title: "events"
        for title in (
            "Events read",
            "Stream lag",
            "Pending entries",
            "Lost events",
            "Invalid events by reason",
        )
    },
    # Recording rules
    "queue:queue_concurrency_used:ratio": "postgres",
    "queue:queue_stats_age_seconds:max": "postgres",
    **{
        rule.record: "events"
        for rule in recording_rules(FAST_RULES)
        if any(
            part in rule.record
            for part in (
                "queue_jobs_",
                "queue_dequeue",
                "queue_workers",
                "worker_utilization",
                "queue_job_",
                "queue_exporter_events",
            )
        )
    },
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


def _workload(client: Any) -> None:
    """Orchestrata lists (two priorities, a dead-letter list) and Runner-Q sorted sets with an
    expired lease and an overdue scheduled item, written as those systems write them."""
    now = time.time()
    for offset in (300, 200, 100):
        _orchestrata_item(client, "orchestrata:queue:billing:p3", "queued_at", now - offset)
    _orchestrata_item(client, "orchestrata:queue:billing:p5", "queued_at", now - 20)
    _orchestrata_item(client, "orchestrata:queue:emails:p0", "queued_at", now - 50)
    _orchestrata_item(client, "orchestrata:dlq:billing", "failed_at", now - 900)
    runnerq_enqueue(client, "jobs", runnerq_activity("send_email", "High", now - 60), now)
    client.zadd("jobs:processing", {f"{uuid.uuid4()}:{{}}": (now - 30) * 1000})
    client.zadd("jobs:scheduled_activities", {f"{uuid.uuid4()}:{{}}": now - 30})
    client.rpush("jobs:dead_letter_queue", json.dumps({"failed_at": iso(now - 600)}))


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = _free_port()
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
def exporters(redis_client: Any, redis_url: str, run_exporter: Callable[..., App]) -> list[App]:
    _workload(redis_client)
    presets = [{"name": "orchestrata", "params": {"max_depth": 4}}, "runnerq"]
    healthy = run_exporter({"presets": presets, "sources": {"redis": {"url": redis_url}}})
    # A replica whose cardinality cap is tiny: it folds series and counts the overflow.
    capped = run_exporter(
        {
            "presets": presets,
            "sources": {"redis": {"url": redis_url}},
            "limits": {"max_series_per_metric": 2},
        }
    )
    # A replica whose Redis is unreachable: its source is down and counts errors.
    blind = run_exporter(
        {"presets": presets, "sources": {"redis": {"url": f"redis://127.0.0.1:{_free_port()}/0"}}}
    )
    return [healthy, capped, blind]


def test_dashboards_and_rules_against_a_real_prometheus(
    exporters: list[App], redis_client: Any, prometheus_for: Callable[[list[App]], Prometheus]
):
    prometheus = prometheus_for(exporters)
    # The first scrape lands after ~5s of target discovery; then let rate windows fill.
    wait_for(lambda: len(prometheus.query(f'up{{job="{SCRAPE_JOB}"}} == 1')) == 3, timeout=60)
    wait_for(lambda: prometheus.query("queue:queue_capacity_used:ratio"), timeout=30)
    time.sleep(5)

    missing = []
    for query in panel_queries():
        result = prometheus.query(query.expr)  # raises unless Prometheus accepted the query
        if query.panel not in NEEDS_SOURCE and not result:
            missing.append(f"{query.dashboard}: {query.panel}: {query.expr}")
    assert missing == [], "panel queries without data:\n" + "\n".join(missing)

    # The dashboards' variables resolve: label_values(<selector>, system|queue).
    selector = '{__name__=~"queue_depth|queue_jobs_enqueued_total", job="queue-exporter"}'
    assert {"orchestrata", "runnerq"} <= set(
        prometheus.api("label/system/values", **{"match[]": selector})
    )
    assert {"billing", "emails", "jobs"} <= set(
        prometheus.api("label/queue/values", **{"match[]": selector})
    )

    groups = prometheus.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(yaml.safe_load(render_rules(FAST_RULES))["groups"][0]["rules"]) + sum(
        len(g["rules"]) for g in yaml.safe_load(render_rules(FAST_RULES))["groups"][1:]
    )
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert unhealthy == []
    empty = [
        rule.record
        for rule in recording_rules(FAST_RULES)
        if rule.record not in NEEDS_SOURCE and not prometheus.query(rule.record)
    ]
    assert empty == [], "recording rules without data"

    def alert(name: str, **labels: str) -> dict[str, Any] | None:
        for item in prometheus.api("alerts")["alerts"]:
            if item["labels"]["alertname"] == name and labels.items() <= item["labels"].items():
                return dict(item)
        return None

    # Nothing was dead-lettered since the exporter started: quiet. Then three jobs die.
    assert alert("QueueDeadLetterGrowing", queue="billing") is None
    for _ in range(3):
        _orchestrata_item(redis_client, "orchestrata:dlq:billing", "failed_at", time.time())
    firing = wait_for(
        lambda: (
            (a := alert("QueueDeadLetterGrowing", queue="billing")) and a["state"] == "firing" and a
        ),
        timeout=30,
    )
    assert firing["labels"]["severity"] == "warning"
    assert firing["labels"]["system"] == "orchestrata"
    assert firing["annotations"]["runbook_url"] == "docs/runbook.md#queuedeadlettergrowing"
    assert "orchestrata/billing grew by 3 items" in firing["annotations"]["description"]

    # The unreachable replica's source is down; the exporter is present.
    down = wait_for(
        lambda: (a := alert("QueueExporterSourceDown")) and a["state"] == "firing" and a, timeout=30
    )
    assert down["labels"]["instance"] == f"127.0.0.1:{exporters[2].server.port}"
    assert down["labels"]["severity"] == "critical"
    assert alert("QueueExporterAbsent") is None
    assert alert("QueueLeasesExpired", queue="jobs") is not None
    # billing holds 4 items against a limit of 4
    assert alert("QueueNearCapacity", queue="billing") is not None
    assert alert("QueueAtCapacity", queue="billing") is not None


def test_the_exposition_passes_promtool_check_metrics(
    redis_client: Any, redis_url: str, run_exporter: Callable[..., App]
):
    require("promtool")
    _workload(redis_client)
    app = run_exporter(
        {
            "presets": ["orchestrata", "runnerq"],
            "sources": {"redis": {"url": redis_url}},
            "limits": {"max_series_per_metric": 3},
        }
    )
    exposition = wait_for(
        lambda: (
            (text := scrape(app.server.port))
            and "queue_exporter_series_overflow_total" in text
            and "queue_leases_expired" in text
            and text
        ),
    )
    result = run("promtool", "check", "metrics", stdin=exposition)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
