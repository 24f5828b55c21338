"""The Redis presets of arq, Dramatiq, Huey, SAQ, Bull, Bee-Queue and Taskiq under exactly the ACL
`queue-exporter redis-acl` prints for them: every queue read (its depths and the ages kept in a
hash field, a JSON string key or a job hash), nothing refused, nothing written.

Each system's keys are written by the library itself (tests/*_app, tests/node/*.cjs) into a
private redis-server whose ACL LOG is read at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from tests.conftest import scrape_series, value, wait_for
from tests.private_redis import PrivateRedis
from tests.real_queues import BeeQueue, Bull
from tests.saq_app.control import driver as saq_driver
from tests.tools import missing

ROOT = Path(__file__).resolve().parents[2]
ARQ_PYTHON = ROOT / ".venv/tools/arq/bin/python"
PASSWORD = "least-privilege-pw"
TASKIQ_PYTHON = ROOT / ".venv/tools/taskiq/bin/python"
PRESETS = ["arq", "dramatiq", "huey", "saq", "bull", "bee_queue", "taskiq"]
# The queue of each system whose pending depth and age the test reads
PENDING = {
    "arq": "arq:queue",
    "dramatiq": "default",
    "huey": "huey",
    "saq": "default",
    "bull": "mail",
    "bee_queue": "mail",
    "taskiq": "taskiq",
}
AGED = ("arq", "dramatiq", "saq", "bull", "bee_queue", "taskiq")  # Huey records no enqueue time


@pytest.fixture
def acl_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _python_driver(python: Path, module: str, url: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
    done = subprocess.run(
        [python, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{module}: {done.stderr[-2000:]}"


def _arq_python() -> Path:
    if not ARQ_PYTHON.exists():
        missing(f"no arq at {ARQ_PYTHON}")
    return ARQ_PYTHON


def seed_arq(url: str, port: int, db: int) -> None:
    arq_plan = [{"queue": "arq:queue", "function": "succeed", "defer_until": -30}]
    _python_driver(_arq_python(), "tests.arq_app.driver", url, url, "enqueue", json.dumps(arq_plan))


def seed_dramatiq(url: str, port: int, db: int) -> None:
    dramatiq_plan = [{"actor": "succeed", "age": 30}, {"actor": "succeed", "delay": 60_000}]
    _python_driver(
        Path(sys.executable), "tests.dramatiq_app.driver", url, "enqueue", json.dumps(dramatiq_plan)
    )


def seed_huey(url: str, port: int, db: int) -> None:
    huey_plan = [{"task": "succeed"}]
    _python_driver(
        Path(sys.executable), "tests.huey_app.driver", url, "enqueue", json.dumps(huey_plan)
    )


def seed_saq(url: str, port: int, db: int) -> None:
    saq_driver(url, "enqueue", json.dumps([{"queue": "default", "function": "succeed"}]))


_NODE_STEPS = (
    {"op": "add", "queue": "mail"},
    {"op": "add", "queue": "mail", "opts": {"delay": 60_000}},
)


def seed_bull(url: str, port: int, db: int) -> None:
    Bull(4, db=db, port=port).steps(*_NODE_STEPS)


def seed_bee_queue(url: str, port: int, db: int) -> None:
    BeeQueue(2, db=db, port=port).steps(*_NODE_STEPS)


def seed_taskiq(url: str, port: int, db: int) -> None:
    """A task sent through taskiq-redis's RedisStreamBroker: its stream and consumer group."""
    if not TASKIQ_PYTHON.exists():
        missing(f"no taskiq at {TASKIQ_PYTHON}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TASKIQ_REDIS_URL": url}
    done = subprocess.run(
        [TASKIQ_PYTHON, "-m", "tests.taskiq_app.driver", "kick", '[{"task": "succeed"}]'],
        env={**env, "TASKIQ_BROKER": "stream"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"taskiq: {done.stderr[-2000:]}"


# Each system's queue PENDING names, written through the library itself into the database at
# `url` (number `db` of the server on `port`): a pending job, and a delayed one where it has any.
SEEDS = {
    "arq": seed_arq,
    "dramatiq": seed_dramatiq,
    "huey": seed_huey,
    "saq": seed_saq,
    "bull": seed_bull,
    "bee_queue": seed_bee_queue,
    "taskiq": seed_taskiq,
}


def _seed(url: str, port: int) -> None:
    _arq_python()  # skipped before any system is written
    for seed in SEEDS.values():
        seed(url, port, 0)


def test_new_redis_presets_run_with_exactly_the_acl_they_print(acl_redis, run_exporter):
    admin = acl_redis.client()
    _seed(f"redis://127.0.0.1:{acl_redis.port}/0", acl_redis.port)
    raw = {
        "presets": PRESETS,
        "sources": {
            "redis": {"url": f"redis://queue-exporter:{PASSWORD}@127.0.0.1:{acl_redis.port}/0"}
        },
    }
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)
    admin.execute_command("ACL", "LOG", "RESET")
    app = run_exporter(raw)

    def settled() -> dict | None:
        series = scrape_series(app)
        depths = {
            system: value(series, "queue_depth", system=system, queue=queue, state="pending")
            for system, queue in PENDING.items()
        }
        ages = {
            system: value(
                series,
                "queue_oldest_age_seconds",
                system=system,
                queue=PENDING[system],
                state="pending",
            )
            for system in AGED
        }
        native = all(
            value(series, "queue_exporter_source_last_success_timestamp_seconds", source=source)
            for source in ("native:saq", "native:bull")
        )
        done = all(depths.values()) and all(age is not None for age in ages.values()) and native
        return series if done else None

    series = wait_for(settled, timeout=30)
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    errors = {
        labels: v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and v > 0
    }
    assert errors == {}
    assert admin.execute_command("ACL", "LOG") == []  # nothing was refused, not even ignored
    # an arq queue is any key (its name, found through workers' health-check keys): the
    # rules read every key (docs/security.md), but write none
    assert "%R~*" in rules
    sidecar = acl_redis.client(username="queue-exporter", password=PASSWORD)
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.rpush("saq:default:queued", "forged")
    sidecar.close()
