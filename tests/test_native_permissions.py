"""A missing permission costs only the figure that needs it, and `check-config --connect` names
it: a private redis-server whose ACL user has exactly the rules `queue-exporter redis-acl`
prints for the bullmq preset, less one, and a real BullMQ worker (issue 40: without
`+client|list` the reader counted 0 of 10 completions, failed every read, `/readyz` 503).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from exporter import config as config_module
from exporter import redis_acl
from tests.conftest import scrape_series, value, wait_for
from tests.private_redis import PrivateRedis
from tests.real_queues import BullMQ
from tests.test_check_config import run_cli

PASSWORD = "figure-pw"
STREAM = "native:bullmq"


@pytest.fixture
def acl_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _config(server: PrivateRedis) -> dict[str, Any]:
    url = f"redis://queue-exporter:{PASSWORD}@127.0.0.1:{server.port}/0"
    return {"presets": ["bullmq"], "sources": {"redis": {"url": url}}, "sample_interval": 0.5}


def _user_without(server: PrivateRedis, raw: dict[str, Any], refused: str) -> None:
    """The ACL user `redis-acl` prints for `raw`, without the rule `refused`."""
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    assert refused in rules
    rules = [rule for rule in rules if rule != refused]
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)


def test_without_client_list_only_the_worker_count_is_lost(acl_redis, run_exporter):
    raw = _config(acl_redis)
    _user_without(acl_redis, raw, "+client|list")
    bullmq = BullMQ(6, 0, port=acl_redis.port)
    try:
        bullmq.steps({"op": "add", "queue": "mail"})  # the queue exists before the baseline
        app = run_exporter(raw)
        wait_for(lambda: app.health.snapshot()[STREAM].up, timeout=30)
        bullmq.steps(
            {"op": "add", "queue": "mail", "count": 10},
            {"op": "work", "queue": "mail", "completed": 11},
        )
        truth = bullmq.truth(["mail"])["queues"]["mail"]["counts"]["completed"]
        assert truth == 11

        def counted() -> dict | None:
            series = scrape_series(app)
            done = value(series, "queue_jobs_completed_total", system="bullmq", queue="mail")
            return series if done == truth else None

        series = wait_for(counted, timeout=30)
        assert value(series, "queue_exporter_source_up", source=STREAM) == 1
        assert value(series, "queue_exporter_native_silent", stream=STREAM) == 1
        assert not [name for name, _ in series if name == "queue_workers"]  # none invented
        assert app.health.ready()
        assert "+client|list" in (app.health.snapshot()[STREAM].silent or "")
    finally:
        bullmq.stop_all()


def _check(server: PrivateRedis, tmp_path: Path) -> tuple[int, list[str]]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(server)))
    result = run_cli("check-config", str(path), "--connect")
    said = [line for line in result.stdout.splitlines() if "native bullmq at" in line]
    return result.returncode, said


def test_check_config_names_each_refused_command_and_what_the_acl_needs(acl_redis, tmp_path):
    _user_without(acl_redis, _config(acl_redis), "+client|list")
    code, said = _check(acl_redis, tmp_path)
    refused = [line for line in said if "refused" in line]
    assert len(refused) == 1, said
    assert "CLIENT LIST refused" in refused[0] and "the ACL needs +client|list" in refused[0]
    assert "queue_workers is not served" in refused[0]
    assert code == 0  # one figure lost: a warning

    _user_without(acl_redis, _config(acl_redis), "+xread")
    code, said = _check(acl_redis, tmp_path)
    refused = [line for line in said if "refused" in line]
    assert len(refused) == 1 and "the ACL needs +xread" in refused[0], said
    assert "every read fails" in refused[0]
    assert code != 0

    _user_without(acl_redis, _config(acl_redis), "%R~bull:*")
    code, said = _check(acl_redis, tmp_path)
    assert any("the ACL needs %R~bull:*" in line for line in said), said
    assert code != 0


def test_check_config_says_nothing_refused_under_the_full_acl(acl_redis, tmp_path):
    raw = _config(acl_redis)
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    admin = acl_redis.client()
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)
    admin.execute_command("ACL", "LOG", "RESET")
    code, said = _check(acl_redis, tmp_path)
    assert code == 0 and not [line for line in said if "refused" in line], said
    # no trial was refused (check-config's DBSIZE, for the key groups, is no reader's)
    refused = {entry[b"object"] for entry in admin.execute_command("ACL", "LOG")}
    assert refused <= {b"dbsize"}
