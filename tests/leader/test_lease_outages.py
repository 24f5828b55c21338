"""Leader outages are visible (issue 23, attacks 8 and 9): when the lease cannot be held, the
sampled sources are down for that reason, /readyz says so, the status page warns and the log
names the cause once, at WARNING.

Each case puts the lease on a private redis-server made unusable in one way (stopped, a
read-only replica, an ACL user without the scripts' commands, the lease key of another type);
the sampled source reads the test's own DB on the shared Redis, which stays healthy.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from alerts.generate import RULES_PATH, rules_document
from exporter.runtime.app import App
from exporter.sources.runner import LEASE_REASON
from tests.conftest import parse_exposition, scrape, scrape_series, value, wait_for
from tests.private_redis import PrivateRedis, free_port
from tests.tools import run

KEY = "queue-exporter:leader"
KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}


def _stopped(server: PrivateRedis) -> str:
    server.stop()
    return server.url


def _read_only_replica(server: PrivateRedis) -> str:
    client = server.client()
    client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary never found
    client.close()
    return server.url


def _no_permission(server: PrivateRedis) -> str:
    client = server.client()
    client.execute_command("ACL", "SETUSER", "lease", "on", ">secret", "~*", "+@read", "-@write")
    client.close()
    return f"redis://lease:secret@127.0.0.1:{server.port}/0"


def _wrong_type(server: PrivateRedis) -> str:
    client = server.client()
    client.hset(KEY, "not", "a lease")
    client.close()
    return server.url


def _readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (_stopped, "connection"),
        (_read_only_replica, "ReadOnlyError"),
        (_no_permission, "NoPermissionError"),
        (_wrong_type, "WRONGTYPE"),
    ],
    ids=["redis-down", "readonly-replica", "noperm", "wrongtype"],
)
def test_a_lease_that_cannot_be_held_is_visible(
    spoil: Callable[[PrivateRedis], str],
    named: str,
    tmp_path: Path,
    redis_url: str,
    redis_client,
    run_exporter: Callable[..., App],
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis_client.rpush("jobs:emails", "a")
    lease_server = PrivateRedis(tmp_path).start()
    try:
        lease_url = spoil(lease_server)
        election = {"enabled": True, "lease_ttl": 1.0, "renew_interval": 0.1}
        election["redis"] = {"url": lease_url, "socket_timeout": 0.5}
        sources = {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}
        with caplog.at_level(logging.INFO, logger="exporter.leader.election"):
            app = run_exporter({"sources": sources, "leader_election": election})
            wait_for(lambda: app.health.snapshot()["redis"].lease_down)
            series = scrape_series(app)
            assert value(series, "queue_exporter_source_up", source="redis") == 0
            assert value(series, "queue_exporter_leader") == 0
            assert value(series, "queue_depth", queue="emails") is None
            errors = value(
                series, "queue_exporter_source_errors_total", source="redis", reason=LEASE_REASON
            )
            assert errors == 1  # once per outage, not per attempt

            code, document = _readyz(app.server.port)
            assert code == 503
            assert "leader lease" in str(document["reason"])

            status = json.loads(scrape(app.server.port, "/status.json"))
            assert any("leader lease" in warning for warning in status["view"]["warnings"])

            attempts = 10  # renewals keep failing: the cause is still logged once
            wait_for(lambda: _lease_warnings(caplog) and _attempts(app) >= attempts)
        warnings = _lease_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert named in warnings[0].getMessage()
    finally:
        lease_server.stop()


def test_a_lease_back_in_reach_is_taken_and_sampling_resumes(
    tmp_path: Path, redis_url: str, redis_client, run_exporter: Callable[..., App]
) -> None:
    redis_client.rpush("jobs:emails", "a", "b")
    lease_server = PrivateRedis(tmp_path).start()
    port = lease_server.port
    lease_server.stop()
    election = {"enabled": True, "lease_ttl": 1.0, "renew_interval": 0.1}
    election["redis"] = {"url": f"redis://127.0.0.1:{port}/0", "socket_timeout": 0.5}
    sources = {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}
    app = run_exporter({"sources": sources, "leader_election": election})
    try:
        wait_for(lambda: app.health.snapshot()["redis"].lease_down)
        assert _readyz(app.server.port)[0] == 503
        lease_server = PrivateRedis(tmp_path, port=port).start()
        wait_for(lambda: value(scrape_series(app), "queue_depth", queue="emails") == 2)
        assert value(scrape_series(app), "queue_exporter_source_up", source="redis") == 1
        assert _readyz(app.server.port)[0] == 200
    finally:
        lease_server.stop()


def _lease_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name == "exporter.leader.election"
        and record.levelno == logging.WARNING
        and "cannot take or renew" in record.getMessage()
    ]


def _attempts(app: App) -> int:
    assert app.leadership is not None
    return app.leadership.attempts


def test_the_shipped_source_down_alert_fires_when_no_replica_can_hold_the_lease(
    tmp_path: Path, redis_url: str, run_exporter: Callable[..., App]
) -> None:
    """What a replica serves while the lease cannot be held, fed to promtool with the shipped
    rules for 10 minutes: QueueExporterSourceDown fires for its sampled source."""
    lease_server = PrivateRedis(tmp_path).start()
    lease_url = _stopped(lease_server)
    election = {"enabled": True, "lease_ttl": 1.0, "renew_interval": 0.1}
    election["redis"] = {"url": lease_url, "socket_timeout": 0.5}
    sources = {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}
    app = run_exporter({"sources": sources, "leader_election": election})
    wait_for(lambda: app.health.snapshot()["redis"].lease_down)
    scraped = parse_exposition(scrape(app.server.port))
    target = {"job": "queue-exporter", "instance": "replica:9839"}
    input_series = [
        {"series": _selector(name, {**dict(labels), **target}), "values": f"{value:g}x15"}
        for (name, labels), value in scraped.items()
        if name.startswith("queue_exporter_source")
    ]
    firing = {
        "alertname": "QueueExporterSourceDown",
        "alertstate": "firing",
        "severity": "critical",
        "source": "redis",
        **target,
    }
    test = {
        "rule_files": [str(RULES_PATH)],
        "evaluation_interval": "1m",
        # the recording rules first in each step (else promtool's order is arbitrary)
        "group_eval_order": [group["name"] for group in rules_document()["groups"]],
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series,
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="QueueExporterSourceDown"}',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": _selector("ALERTS", firing), "value": 1}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "lease.test.yml"
    path.write_text(yaml.safe_dump(test))
    result = run("promtool", "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"
