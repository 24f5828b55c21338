"""The generated rules: committed output up to date, promtool-valid, every alert unit-tested,
conventions kept, the runbook covering every alert, the Alertmanager example routing right."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.alerting import alerting_rules
from alerts.config import DEFAULTS, with_short_windows
from alerts.generate import (
    ALERTS_TABLE_PATH,
    RULES_PATH,
    RUNBOOK_PATH,
    outputs,
    render_rules,
    rules_document,
)
from alerts.recorded import RECORD_ENV, load, path_of, record_or_compare, recordings
from alerts.recording import JOB_COUNTERS, JOB_TIMINGS, recording_rules
from alerts.systems import SYSTEMS, Proof, outcomes
from exporter.config import presets
from tests.tools import run

ALERTS_DIR = RULES_PATH.parent
UNIT_TESTS = sorted((ALERTS_DIR / "tests").glob("*.test.yml"))
ALERTMANAGER_EXAMPLE = ALERTS_DIR / "alertmanager.example.yml"


def _unit_tests() -> list[dict[str, Any]]:
    return [test for path in UNIT_TESTS for test in yaml.safe_load(path.read_text())["tests"]]


def test_committed_rules_and_runbook_are_what_the_code_generates():
    for path, text in outputs().items():
        assert path.read_text() == text, f"{path.name} is stale: run `python -m alerts`"


def test_promtool_check_rules():
    result = run("promtool", "check", "rules", str(RULES_PATH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_each_promtool_test_file_orders_the_groups_recording_rules_first():
    """Without group_eval_order promtool evaluates a step's groups in an arbitrary order, and an
    alert on a recorded series may read the last step's value: a test then fails now and then."""
    groups = [group["name"] for group in rules_document()["groups"]]
    assert groups[0] == "queue-exporter.rules"  # the recording rules
    for path in [*UNIT_TESTS, ALERTS_DIR / "tests" / "fitted" / "fitted.test.yml"]:
        assert yaml.safe_load(path.read_text())["group_eval_order"] == groups, path.name


def test_promtool_unit_tests_pass():
    assert UNIT_TESTS
    result = run("promtool", "test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_case_and_a_silent_case():
    fires: dict[str, list[dict[str, Any]]] = {}
    silent: set[str] = set()
    for test in _unit_tests():
        for case in test.get("alert_rule_test", []):
            if case["exp_alerts"]:
                fires.setdefault(case["alertname"], []).extend(case["exp_alerts"])
            else:
                silent.add(case["alertname"])
    names = {alert.name for alert in alerting_rules(DEFAULTS)}
    assert names - fires.keys() == set(), "alerts without a case where they fire"
    assert names - silent == set(), "alerts without a case where they must not fire"
    for name, expected in fires.items():
        for alert in expected:
            assert alert["exp_labels"]["severity"], name
            assert {"summary", "description", "runbook_url"} <= alert["exp_annotations"].keys(), (
                name
            )


def test_every_recording_rule_has_a_promql_test():
    tested = " ".join(
        case["expr"] for test in _unit_tests() for case in test.get("promql_expr_test", [])
    )
    untested = {r.record for r in recording_rules(DEFAULTS) if r.record not in tested}
    # Generated families are tested through some of their members.
    family_members = {f"queue:queue_jobs_{c}:rate5m" for c in JOB_COUNTERS} | {
        f"queue_job_type_le:queue_job_{t}_seconds_bucket:rate5m" for t in JOB_TIMINGS
    }
    assert untested - family_members == set()
    assert untested != family_members, "no member of the generated families is tested"


def test_alert_conventions():
    runbook = RUNBOOK_PATH.read_text()
    headings = set(re.findall(r"^## (\w+)$", runbook, flags=re.MULTILINE))
    document = yaml.safe_load(RULES_PATH.read_text())
    alerts = [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]
    assert len(alerts) == len(alerting_rules(DEFAULTS)) >= 15
    assert {a["labels"]["severity"] for a in alerts} == {"critical", "warning", "info"}
    for alert in alerts:
        name = alert["alert"]
        assert re.fullmatch(r"Queue(Exporter)?[A-Z][A-Za-z]+", name), name
        assert {"summary", "description", "runbook_url"} == alert["annotations"].keys()
        assert alert["annotations"]["runbook_url"] == f"docs/runbook.md#{name.lower()}"
        assert name in headings, f"{name} has no runbook section"
    assert headings == {a["alert"] for a in alerts}
    names = [a["alert"] for a in alerts]
    assert len(names) == len(set(names))
    required = {
        "QueueBacklogGrowing",
        "QueueOldestItemTooOld",
        "QueueDeadLetterGrowing",
        "QueueNearCapacity",
        "QueueJobFailureRatioHigh",
        "QueueJobsStuckActive",
        "QueueLeasesExpired",
        "QueueScheduledOverdue",
        "QueueNoWorkers",
        "QueueWorkersSaturated",
        "QueueStatsStale",
        "QueueExporterSourceDown",
        "QueueExporterKeyGroupUnmatched",
        "QueueExporterEventsLagging",
        "QueueExporterEventsLost",
        "QueueExporterAbsent",
        "QueueExporterSeriesOverflow",
    }
    assert required <= set(names)
    absent = next(a for a in alerts if a["alert"] == "QueueExporterAbsent")
    assert absent["expr"].startswith("absent(")


def test_the_readme_states_the_alert_count():
    readme = (ALERTS_DIR.parent / "README.md").read_text()
    assert re.findall(r"(\d+) alerts with", readme) == [str(len(alerting_rules(DEFAULTS)))]


def test_thresholds_and_runbook_base_come_from_the_config():
    config = dataclasses.replace(
        DEFAULTS, oldest_age_seconds=42, rate_window="2m", runbook_url_base="https://x/rb.md"
    )
    rendered = render_rules(config)
    assert "queue:queue_oldest_age_seconds:max > 42" in rendered
    assert "queue:queue_jobs_failure:ratio_rate2m" in rendered
    assert "rate5m" not in rendered
    assert "runbook_url: https://x/rb.md#queueexporterabsent" in rendered


FITTED = ALERTS_DIR / "tests" / "fitted"


def fitted_rules_pass_promtool(rules_text: str, tmp_path: Path) -> None:
    """promtool's unit tests of the settings in alerts/tests/fitted/settings.yml, on rules built
    with them (they fail on the default rules: a job, a runbook URL and thresholds of their own)."""
    (tmp_path / "fitted.rules.yml").write_text(rules_text)
    shutil.copy(FITTED / "fitted.test.yml", tmp_path)
    checked = run("promtool", "check", "rules", str(tmp_path / "fitted.rules.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = run("promtool", "test", "rules", str(tmp_path / "fitted.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_fitted_by_the_command_pass_their_promtool_tests(tmp_path: Path):
    """`python -m alerts --values FILE --output FILE` (docs/dashboards-and-alerts.md): a plain
    Prometheus's rules for another job, runbook and thresholds, without editing code."""
    output = tmp_path / "fitted.rules.yml"
    command = [sys.executable, "-m", "alerts", "--values", str(FITTED / "settings.yml")]
    result = subprocess.run(
        [*command, "--output", str(output)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    fitted_rules_pass_promtool(output.read_text(), tmp_path)
    defaults = tmp_path / "defaults"
    defaults.mkdir()
    with pytest.raises(AssertionError):  # the same tests fail on the defaults
        fitted_rules_pass_promtool(RULES_PATH.read_text(), defaults)
    by_flags = subprocess.run(
        [
            sys.executable,
            "-m",
            "alerts",
            "--job",
            "my-queues",
            "--runbook-url-base",
            "https://runbooks.example.org/queue-exporter.md",
            "--set",
            "oldest_age_seconds=60",
            "--set",
            "oldest_age_for=2m",
            "--set",
            "failure_ratio=0.5",
            "--output",
            str(tmp_path / "by-flags.rules.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert by_flags.returncode == 0, by_flags.stderr
    assert (tmp_path / "by-flags.rules.yml").read_text() == output.read_text()


@pytest.mark.parametrize(
    ("argument", "complaint"),
    [
        ("oldest_age_secs=60", "not a setting: oldest_age_secs (settable: job, "),
        ("oldest_age_seconds=soon", "oldest_age_seconds: 'soon' is not a number"),
        ("oldest_age_for=5 minutes", "is not a Prometheus duration"),
        ("rate_window=2m", "not a setting: rate_window"),
    ],
)
def test_bad_settings_are_refused_by_name(argument: str, complaint: str, tmp_path: Path):
    output = tmp_path / "x.rules.yml"
    result = subprocess.run(
        [sys.executable, "-m", "alerts", "--set", argument, "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert complaint in result.stderr
    assert not output.exists()


def test_rules_generated_with_short_windows_are_valid(tmp_path: Path):
    """The end-to-end test runs such a variant; promtool must accept it too."""
    path = tmp_path / "fast.rules.yml"
    path.write_text(render_rules(with_short_windows(DEFAULTS)))
    result = run("promtool", "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_example_is_valid():
    result = run("amtool", "check-config", str(ALERTMANAGER_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=QueueNoWorkers", "queue=jobs"], "pager"),
        (["severity=critical", "alertname=QueueExporterAbsent"], "pager"),
        (["severity=warning", "alertname=QueueBacklogGrowing", "queue=jobs"], "chat"),
        (["severity=info", "alertname=QueueExporterInvalidEvents"], "blackhole"),
        (["alertname=SomethingElse"], "chat"),
    ],
)
def test_alertmanager_example_routes(labels: list[str], receiver: str):
    result = run(
        "amtool",
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_EXAMPLE}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


SYSTEM_TESTS = ALERTS_DIR / "tests" / "systems"


def test_each_recorded_systems_promtool_proofs_pass(tmp_path: Path):
    """docs/alerts.md's every "fires": the generated tests on each system's served series. The
    majors of a system mostly serve the same series: each distinct test runs once, all in one
    promtool run (each file also runs alone: `promtool test rules alerts/tests/systems/*`)."""
    expected = {SYSTEM_TESTS / f"{r.case}.test.yml" for r in recordings()}
    assert expected, "no recordings in alerts/tests/recorded"
    assert set(SYSTEM_TESTS.glob("*")) == expected, "a file there is no recording's: remove it"
    documents = [yaml.safe_load(path.read_text()) for path in sorted(expected)]
    distinct: dict[str, dict[str, Any]] = {}
    for document in documents:
        for test in document["tests"]:
            body = {k: v for k, v in test.items() if k != "name"}
            distinct.setdefault(yaml.safe_dump(body, sort_keys=True), test)
    merged = {**documents[0], "rule_files": [str(RULES_PATH)], "tests": list(distinct.values())}
    (tmp_path / "systems.test.yml").write_text(yaml.safe_dump(merged, sort_keys=False))
    result = run("promtool", "test", "rules", str(tmp_path / "systems.test.yml"), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _firing(alert: str) -> set[str]:
    return {r.system for r in recordings() if isinstance(outcomes(r)[alert], Proof)}


def test_a_stalled_queue_is_caught_for_every_recorded_system_but_those_named():
    """Issue 39: workers per queue (QueueNoWorkers), or finished jobs or the head's age
    (QueueNotProcessing). Huey by its PriorityRedisHuey queues' ages alone: a RedisHuey list
    records no enqueue time, no outcome and no worker (docs/presets.md)."""
    caught = _firing("QueueNoWorkers") | _firing("QueueNotProcessing")
    assert {r.system for r in recordings()} - caught == set()


def test_saturation_fires_only_where_workers_say_their_slots():
    """RQ and Resque workers run one job at a time, Sidekiq processes say their concurrency, Celery
    workers their pool's max-concurrency (inspection), Orchestrata's workers their capacity in
    each heartbeat event, Oban's producers each queue's local_limit: no system's slot count is
    made up (Bull's and BullMQ's CLIENT LIST does not tell one)."""
    saying = {"rq", "resque", "sidekiq", "celery", "orchestrata", "oban"}
    assert _firing("QueueWorkersSaturated") == saying


def test_the_alerts_table_covers_every_alert_and_every_preset_s_system():
    assert {system for system, _ in SYSTEMS} == set(presets.available())
    table = ALERTS_TABLE_PATH.read_text()
    header = next(line for line in table.splitlines() if line.startswith("| alert |"))
    assert header.count("|") - 2 == len(SYSTEMS)
    for alert in alerting_rules(DEFAULTS):
        row = next(line for line in table.splitlines() if line.startswith(f"| [{alert.name}]"))
        assert row.count("|") - 2 == len(SYSTEMS), alert.name


def test_a_change_in_how_a_system_serves_makes_its_recording_stale(
    monkeypatch: pytest.MonkeyPatch,
):
    """alerts/recorded.py as the conformance hook calls it, on SAQ's recording: a metric served
    with other label names (what an alert matches on) is stale, naming the command; a series a
    run did not show (timing) is not."""
    monkeypatch.delenv(RECORD_ENV, raising=False)  # compare, never write
    recorded = load(path_of("saq"))

    def compared(*leave_out: str, add: tuple[str, dict[str, str]] | None = None) -> str | None:
        served = {(n, frozenset(ls)): 0.0 for n, ls in recorded.series if n not in leave_out}
        if add is not None:
            served[(add[0], frozenset(add[1].items()))] = 1.0
        return record_or_compare("saq", "saq", "conformance", [served])

    assert compared() is None
    assert compared("queue_jobs_failed_total", "queue_oldest_age_seconds") is None
    no_queue = ("queue_depth", {"system": "saq", "state": "pending"})  # its queue label gone
    changed = compared("queue_depth", add=no_queue)
    assert changed is not None
    assert "queue_depth: labels [('state', 'system')], recorded [('priority', 'queue'" in changed
    assert "QE_RECORD_SERIES=1 bash scripts/test.sh tests/conformance -k saq" in changed
