"""The generated dashboards: committed JSON up to date, the conventions every panel keeps, and
every query valid PromQL (promtool parses them; test_prometheus_e2e.py runs them)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import yaml

from dashboards.generate import outputs
from tests.dashboard_queries import dashboards, panel_queries, panels
from tests.tools import run

VARIABLES = ["datasource", "namespace", "job", "system", "queue", "job_type"]
# The job-duration panels: exemplars drawn, and a link to the tracing data source's traces.
DURATION_PANELS = {"Execution time", "Wait time", "Total time", "p95 execution time by job type"}


def test_committed_json_is_what_the_code_generates():
    generated = outputs()
    assert {p.name for p in generated} == set(dashboards())
    for path, text in generated.items():
        assert path.read_text() == text, f"{path.name} is stale: run `python -m dashboards`"


def test_each_dashboard_states_the_grafana_version_it_needs():
    """The version is the Grafana release the pinned SDK build targets (its own version)."""
    sdk_targets = version("grafana-foundation-sdk").partition("!")[2]
    for name, document in dashboards().items():
        grafana = [need for need in document["__requires"] if need["id"] == "grafana"]
        assert grafana == [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": sdk_targets}
        ], name
    readme = Path(__file__).resolve().parents[2] / "docs" / "dashboards-and-alerts.md"
    assert f"Grafana {sdk_targets} or newer" in readme.read_text()


def test_dashboard_conventions():
    uids = set()
    for name, document in dashboards().items():
        assert document["schemaVersion"] == 41, name
        uids.add(document["uid"])
        assert "queue-exporter" in document["tags"]
        assert document["title"].startswith("Queue exporter / "), name  # whose, in a Grafana
        tracing = ["tracing_datasource"] if name == "queue-exporter-jobs.json" else []
        assert [v["name"] for v in document["templating"]["list"]] == VARIABLES + tracing
        for variable in document["templating"]["list"][1 : len(VARIABLES)]:
            assert variable["includeAll"] and variable["allValue"] == ".*", variable["name"]
            assert variable["datasource"]["uid"] == "${datasource}"
    assert len(uids) == len(dashboards())


def test_every_panel_has_a_description_a_unit_and_queries():
    titles = []
    for name, document in dashboards().items():
        for panel in panels(document):
            where = f"{name}: {panel['title']}"
            titles.append(panel["title"])
            assert len(panel.get("description", "")) > 20, where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"]["uid"] == "${datasource}", where
            assert panel["targets"], where
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", where
                assert "$job" in target["expr"] and "$namespace" in target["expr"], where
    assert len(titles) == len(set(titles)), "panel titles must be unique (tests refer to them)"
    assert len(titles) >= 40


def test_the_required_panels_exist():
    titles = {panel["title"] for document in dashboards().values() for panel in panels(document)}
    for required in (
        "Depth by queue and state",
        "Pending depth by priority",
        "Oldest item age",
        "Dead-letter depth",
        "Capacity use (depth / max depth)",
        "Concurrency use (active / limit)",
        "Enqueue vs completion rate",
        "Top queues by backlog",
        "Throughput by job type",
        "Failure ratio by error type",
        "Execution time",
        "Wait time",
        "Total time",
        "Retries and requeues",
        "Attempts per job",
        "Dead letters",
        "Schedule delay and retry delay",
        "Workers busy and idle",
        "Utilisation",
        "Dequeue hits vs empty polls",
        "Backend operation latency p95",
        "Reaper health",
        "Scheduler health",
        "Idempotency conflicts and reuses",
        "Sources up",
        "Sample duration",
        "Stream lag",
        "Pending entries",
        "Lost events",
        "Invalid events by reason",
        "Series overflow",
    ):
        assert required in titles


def test_every_query_is_valid_promql(tmp_path: Path):
    """promtool parses each query as a recording rule's expression."""
    queries = panel_queries()
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel_query_{i}", "expr": q.expr} for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "panels.rules.yml"
    path.write_text(yaml.safe_dump(rules, width=1_000))
    result = run("promtool", "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_job_duration_panels_show_exemplars_and_link_the_tracing_data_source():
    """Each duration panel's range queries ask for exemplars (the exporter serves them in
    OpenMetrics: tests/prometheus/test_prometheus_exemplars.py); its link opens the traces of
    the data source the `tracing_datasource` variable names, a variable of Grafana's Tempo
    data source type (docs/dashboards-and-alerts.md: Jaeger's)."""
    jobs = dashboards()["queue-exporter-jobs.json"]
    (tracing,) = [v for v in jobs["templating"]["list"] if v["name"] == "tracing_datasource"]
    assert (tracing["type"], tracing["query"], tracing["multi"]) == ("datasource", "tempo", False)
    asking = set()
    for name, document in dashboards().items():
        for panel in panels(document):
            if any(target.get("exemplar") for target in panel["targets"]):
                asking.add(panel["title"])
                assert name == "queue-exporter-jobs.json"
                assert all(target["exemplar"] for target in panel["targets"]), panel["title"]
                assert "_seconds_bucket" in panel["targets"][0]["expr"], panel["title"]
                (link,) = panel["links"]
                assert "${tracing_datasource}" in link["url"] and link["url"].startswith(
                    "/explore?"
                )
    assert asking == DURATION_PANELS
    readme = Path(__file__).resolve().parents[2] / "docs" / "dashboards-and-alerts.md"
    for needed in ("exemplarTraceIdDestinations", "tracing_datasource", "Tempo", "Jaeger"):
        assert needed in readme.read_text(), needed
