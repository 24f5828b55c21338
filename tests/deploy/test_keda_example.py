"""The KEDA example (helm/examples/keda-autoscaling): rendered with Helm, its ScaledObject held to
the fields KEDA's CRD requires, and its queries run by promtool against series as the exporter
serves them: deduplicated across replicas, 0 (not absent) once an empty queue's key is gone while
the exporter's sources are up, and no value at all in an outage (Redis or the exporter): an
outage never reads as "0 pending", which would scale the workers down."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_helm_chart import documents, helm
from tests.tools import run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "helm" / "examples" / "keda-autoscaling"
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The Prometheus scaler's metadata keys (KEDA 2.x docs): anything else is a typo KEDA ignores.
PROMETHEUS_SCALER_KEYS = {
    "serverAddress",
    "query",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "queryParameters",
    "unsafeSsl",
}


def _scaled_object(values: dict[str, Any] | None = None) -> dict[str, Any]:
    chart = helm.Chart.load(str(EXAMPLE))
    docs = documents(chart.render(values or {}, name="queues", namespace="jobs"))
    (scaled,) = docs
    return scaled


def test_strict_lint_is_clean():
    report = helm.lint(str(EXAMPLE), {}, strict=True, kube_version="v1.30.0")
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_the_scaled_object_has_what_kedas_crd_requires():
    scaled = _scaled_object()
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert _DNS1123.match(scaled["metadata"]["name"])
    assert scaled["metadata"]["namespace"] == "jobs"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"name": "worker"}  # a Deployment by default
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert all(isinstance(spec[key], int) for key in ("pollingInterval", "cooldownPeriod"))
    names = [trigger["name"] for trigger in spec["triggers"]]
    assert len(names) == len(set(names)) == 2
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        metadata = trigger["metadata"]
        assert set(metadata) <= PROMETHEUS_SCALER_KEYS
        assert {"serverAddress", "query", "threshold"} <= set(metadata)
        # KEDA's trigger metadata is map[string]string: a bare number is refused.
        assert all(isinstance(value, str) for value in metadata.values()), metadata
        assert float(metadata["threshold"]) > 0


def test_two_queues_give_four_triggers():
    queues = [
        {"system": "rq", "queue": "default", "depthPerReplica": 50, "oldestAgePerReplica": 30},
        {"system": "celery", "queue": "emails", "depthPerReplica": 10, "oldestAgePerReplica": 5},
    ]
    triggers = _scaled_object({"queues": queues})["spec"]["triggers"]
    assert [t["name"] for t in triggers] == [
        "rq-default-depth",
        "rq-default-oldest-age",
        "celery-emails-depth",
        "celery-emails-oldest-age",
    ]
    assert [t["metadata"]["threshold"] for t in triggers] == ["50", "30", "10", "5"]


def test_the_queries_read_what_the_exporter_serves(tmp_path):
    triggers = _scaled_object()["spec"]["triggers"]
    depth, age = (trigger["metadata"]["query"] for trigger in triggers)
    rules = {
        "groups": [
            {
                "name": "keda",
                "rules": [
                    {"record": "keda:depth", "expr": depth},
                    {"record": "keda:oldest_age", "expr": age},
                ],
            }
        ]
    }
    (tmp_path / "keda.rules.yml").write_text(yaml.safe_dump(rules))
    labels = 'job="queue-exporter",system="rq",queue="default",priority="",state="pending"'
    other = 'job="queue-exporter",system="rq",queue="reports",priority="",state="pending"'
    up = 'job="queue-exporter"'
    tests = {
        "rule_files": ["keda.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # Two exporter replicas serve the same sampled depth: counted once.
                    {"series": f'queue_depth{{{labels},instance="a"}}', "values": "250x4"},
                    {"series": f'queue_depth{{{labels},instance="b"}}', "values": "250x4"},
                    {"series": f'queue_depth{{{other},instance="a"}}', "values": "999x30"},
                    {
                        "series": f'queue_oldest_age_seconds{{{labels},instance="a"}}',
                        "values": "90x4",
                    },
                    # The sources answer until 14m (replica b's Redis source is down all along:
                    # replica a's answers), then Redis is down (15m-20m), then the exporter is
                    # gone (no series at all from 21m, none within the lookback from 26m).
                    {
                        "series": f'queue_exporter_source_up{{{up},source="redis",instance="a"}}',
                        "values": "1x14 0x5",
                    },
                    {
                        "series": f'queue_exporter_source_up{{{up},source="redis",instance="b"}}',
                        "values": "0x20",
                    },
                    {
                        "series": f'queue_exporter_source_up{{{up},source="native:rq",instance="a"}}',
                        "values": "1x20",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": "keda:depth",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "keda:depth", "value": 250}],
                    },
                    {
                        "expr": "keda:oldest_age",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "keda:oldest_age", "value": 90}],
                    },
                    # The queue emptied and its key went away: 0, not "no value".
                    *(
                        {
                            "expr": expr,
                            "eval_time": "12m",
                            "exp_samples": [{"labels": expr, "value": 0}],
                        }
                        for expr in ("keda:depth", "keda:oldest_age")
                    ),
                    # Redis down, then the exporter gone: no value, never 0.
                    *(
                        {"expr": expr, "eval_time": at, "exp_samples": []}
                        for expr in ("keda:depth", "keda:oldest_age")
                        for at in ("17m", "28m")
                    ),
                ],
            }
        ],
    }
    (tmp_path / "keda.test.yml").write_text(yaml.safe_dump(tests))
    checked = run("promtool", "check", "rules", str(tmp_path / "keda.rules.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = run("promtool", "test", "rules", str(tmp_path / "keda.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
