"""The sidecar runs with exactly the permissions docs/security.md grants, and no more.

Redis: a redis-server of the test's own gets the ACL user that `redis_acl` builds (the line
`queue-exporter redis-acl` prints and the docs show); every Redis preset and both event
stream formats run as that user, every metric comes out, no error is counted and the ACL
log records no refusal. PostgreSQL: a fresh database and a login role with USAGE on the
schema and SELECT on the sampled tables only.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from rq import Queue

from exporter.commands import redis_acl
from exporter.commands.cli import main
from exporter.config import settings as config_module
from tests import layouts
from tests.attune_db import Attune
from tests.commands.test_least_privilege_queues import seed_taskiq
from tests.conftest import POSTGRES_ADMIN_DSN, scrape_series, value, wait_for
from tests.djangoq_app.control import DEFAULT, DjangoQ
from tests.private_redis import PrivateRedis
from tests.real_queues import BullMQ, NodeResque, Sidekiq

PASSWORD = "least-privilege-pw"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
REDIS_PRESETS = [
    "orchestrata", "runnerq", "rq", "celery", "bullmq", "sidekiq", "resque", "taskiq", "django_q"
]  # fmt: skip
# Celery's queues named: found queues may have any name (%R~*), named ones narrow the ACL to
# their lists (docs/security.md)
PRESET_ENTRIES = [
    {"name": name, "params": {"queues": ["celery"]}} if name == "celery" else name
    for name in REDIS_PRESETS
]


@pytest.fixture
def acl_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _seed(client: redis.Redis, now: float, tmp_path: Path) -> NodeResque:
    """Queue keys of every Redis preset, written as the systems write them (RQ, Celery, BullMQ,
    Sidekiq, node-resque, taskiq-redis and django-q2 by the libraries themselves)."""
    client.rpush("orchestrata:queue:billing:p3", json.dumps({"queued_at": layouts.iso(now - 60)}))
    client.rpush("orchestrata:dlq:billing", json.dumps({"failed_at": layouts.iso(now - 90)}))
    activity = layouts.runnerq_activity("send_email", "Normal", now - 30)
    layouts.runnerq_enqueue(client, "default", activity, now)
    client.hset(f"activity:{activity['id']}", mapping=layouts.runnerq_hash(activity, "Pending"))
    port = client.connection_pool.connection_kwargs["port"]
    Queue("default", connection=client).enqueue("tests.rq_app.jobs.sleep_for", 0)
    celery = Celery(broker=f"redis://127.0.0.1:{port}/0")
    for priority in (0, 3):  # the bare list and the "\x06\x163" one
        celery.send_task("tests.sleep_for", args=(0,), queue="celery", priority=priority)
    BullMQ(6, db=0, port=port).steps(
        {"op": "add", "queue": "mail"}, {"op": "add", "queue": "mail", "opts": {"delay": 60_000}}
    )
    Sidekiq(db=0, port=port).push({"queue": "default"}, {"queue": "default", "in": 600})
    resque = NodeResque(db=0, port=port)
    resque.hold(
        {"op": "enqueue", "queue": "mail", "count": 2},
        {"op": "enqueue", "queue": "mail", "job": "fail"},
        {"op": "work", "queues": ["mail"], "name": "host:1", "completed": 2, "failed": 1},
        {"op": "enqueueIn", "queue": "mail", "ms": 600_000},
        {"op": "idle", "queues": ["mail"], "name": "host:2"},  # its record read (GET) each read
    )
    seed_taskiq(f"redis://127.0.0.1:{port}/0", port, 0)  # its stream, read through its group
    django_q = DjangoQ(f"redis://127.0.0.1:{port}/0", tmp_path / "django.sqlite3")
    django_q.driver(DEFAULT, "enqueue", "succeed", "1")  # its age read from the signed task
    client.set("secrets:not-a-queue", "nobody's business")
    return resque  # its idle worker runs until stopped


def _events_config(port: int) -> dict[str, Any]:
    return {
        "presets": PRESET_ENTRIES,
        "sources": {
            "redis": {"url": f"redis://queue-exporter:{PASSWORD}@127.0.0.1:{port}/0"},
            "events": {"streams": ["qe:events"]},
        },
        "leader_election": {"enabled": True, "lease_ttl": 3, "renew_interval": 1},
    }


def _errors(series: dict) -> dict:
    return {
        labels: v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total" and v > 0
    }


def test_redis_sidecar_runs_with_exactly_the_documented_acl(acl_redis, run_exporter, tmp_path):
    admin = acl_redis.client()
    now = time.time()
    resque = _seed(admin, now, tmp_path)
    try:
        _runs_with_the_acl(acl_redis, admin, run_exporter, now)
    finally:
        resque.stop_all()


def _runs_with_the_acl(
    acl_redis: PrivateRedis, admin: redis.Redis, run_exporter: Any, now: float
) -> None:
    raw = _events_config(acl_redis.port)
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)
    admin.execute_command("ACL", "LOG", "RESET")

    app = run_exporter(raw)
    streams = ("qe:events", "default:events_stream")
    wait_for(lambda: all(app.health.snapshot()[f"events:{key}"].up for key in streams))
    admin.xadd("qe:events", {"v": "1", "event": "enqueued", "ts": str(now), "queue": "mail"})
    admin.xadd(
        "default:events_stream",
        layouts.runnerq_event(str(uuid.uuid4()), "Enqueued", now, None, {"priority": "Normal"}),
    )

    def settled() -> dict | None:
        series = scrape_series(app)
        counted = all(
            (value(series, "queue_exporter_events_total", stream=key) or 0) >= 1 for key in streams
        )
        systems = {dict(labels).get("system") for name, labels in series if name == "queue_depth"}
        native_read = all(
            value(series, "queue_exporter_source_last_success_timestamp_seconds", source=source)
            for source in ("native:rq", "native:celery", "native:resque")
        )
        return series if counted and native_read and set(REDIS_PRESETS) <= systems else None

    series = wait_for(settled, timeout=30)
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    assert value(series, "queue_exporter_leader") == 1  # the lease works under the ACL too
    assert value(series, "queue_depth", system="celery", queue="celery", state="pending") == 2
    assert value(series, "queue_depth", system="resque", queue="mail", state="failed") == 1
    assert value(series, "queue_workers", system="resque", queue="mail", state="idle") == 1
    assert value(series, "queue_depth", system="taskiq", queue="taskiq", state="pending") == 1
    assert value(series, "queue_oldest_age_seconds", system="taskiq", state="pending") is not None
    assert value(series, "queue_depth", system="django_q", queue="default", state="pending") == 1
    age = {"system": "django_q", "queue": "default", "state": "pending"}
    assert value(series, "queue_oldest_age_seconds", **age) is not None
    assert _errors(series) == {}
    assert admin.execute_command("ACL", "LOG") == []  # nothing was refused, not even ignored

    # ... and nothing beyond: no writes to queues, no reads outside them.
    sidecar = acl_redis.client(username="queue-exporter", password=PASSWORD)
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.rpush("orchestrata:queue:billing:p3", "forged")
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.get("secrets:not-a-queue")
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.mget("secrets:not-a-queue")  # the Sidekiq reader's MGET: its counters alone
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.delete("qe:events")
    with pytest.raises(redis.exceptions.NoPermissionError):
        sidecar.config_get("*")
    assert sidecar.set("queue-exporter:lease", "me", nx=True, px=1000)  # reserved for the lease
    sidecar.close()


@pytest.mark.fast
def test_redis_acl_command_prints_the_line_the_docs_show(tmp_path):
    config = tmp_path / "config.yml"
    config.write_text(
        json.dumps({"presets": ["orchestrata"], "sources": {"events": {"streams": ["qe:events"]}}})
    )
    result = CliRunner().invoke(main, ["redis-acl", str(config)])
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("ACL SETUSER queue-exporter reset on ><password> -@all +ping")
    assert "%R~orchestrata:queue:*:p*" in line
    assert line in DOCS.read_text()
    celery = tmp_path / "celery.yml"
    celery.write_text(json.dumps({"presets": [{"name": "celery", "params": {"queues": ["a"]}}]}))
    result = CliRunner().invoke(main, ["redis-acl", str(celery), "--user", "qe"])
    assert '"%R~a\\x06\\x163"' in result.output  # redis-cli quoting for control bytes
    assert "%R~_kombu.binding.*" in result.output  # the queues are found in kombu's bindings
    assert "%R~a " in result.output and "%R~* " not in result.output  # the queues named only
    # every queue found (the default): any key may be one
    celery.write_text(json.dumps({"presets": ["celery"]}))
    result = CliRunner().invoke(main, ["redis-acl", str(celery), "--user", "qe"])
    assert "%R~* " in result.output


# -- PostgreSQL -----------------------------------------------------------------------------


def grant_statements(role: str, schema: str = "attune") -> list[str]:
    """The statements docs/security.md lists for the attune preset, for `role`."""
    text = DOCS.read_text()
    block = re.search(r"```sql\n(.*?)```", text[text.index("## PostgreSQL") :], re.DOTALL)
    assert block is not None, "docs/security.md has no sql block under ## PostgreSQL"
    statements = [s.strip() for s in block.group(1).split(";") if s.strip()]
    statements = [s for s in statements if not s.lstrip().startswith("--")]
    return [
        s.replace("queue_exporter", role).replace("<password>", PASSWORD).replace("attune", schema)
        for s in statements
    ]


@pytest.fixture
def postgres_role(postgres_dsn):
    role = f"qe_test_least_{uuid.uuid4().hex[:8]}"
    yield role
    with psycopg.connect(postgres_dsn, autocommit=True) as database:
        database.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_postgres_sidecar_runs_with_select_on_the_sampled_tables_only(
    postgres_dsn, postgres_role, run_exporter
):
    attune = Attune(postgres_dsn).create_schema()
    attune.connection.execute("CREATE TABLE attune.secrets (token text)")
    dbname = psycopg.conninfo.conninfo_to_dict(postgres_dsn)["dbname"]
    with psycopg.connect(postgres_dsn, autocommit=True) as database:
        for statement in grant_statements(postgres_role):
            database.execute(statement.replace("<database>", str(dbname)))
    _seed_attune(attune)
    sidecar_dsn = f"{postgres_dsn} user={postgres_role} password={PASSWORD}"
    app = run_exporter({"presets": ["attune"]}, postgres_dsn=sidecar_dsn)

    def settled() -> dict | None:
        series = scrape_series(app)
        ups = [value(series, "queue_exporter_source_up", source=s) for s in _ATTUNE_SOURCES]
        return series if all(up == 1 for up in ups) else None

    series = wait_for(settled, timeout=30)
    assert _errors(series) == {}
    assert value(series, "queue_depth", system="attune", queue="core.echo", state="pending") == 2

    sidecar = psycopg.connect(sidecar_dsn)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        sidecar.execute("SELECT * FROM attune.secrets")
    sidecar.rollback()
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # the role is read-only
        sidecar.execute("DELETE FROM attune.queue_stats")
    sidecar.rollback()
    sidecar.execute("SET default_transaction_read_only = off")  # and if it undoes that:
    sidecar.commit()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        sidecar.execute("DELETE FROM attune.queue_stats")
    sidecar.close()


_ATTUNE_SOURCES = ("postgres:attune_queue_stats", "postgres:attune_executions")


def _seed_attune(attune: Attune) -> None:
    echo = attune.add_action("core.echo")
    attune.upsert_stats(echo, queue_length=2, active_count=1, max_concurrent=3)
    attune.add_executions(echo, "core.echo", "running", 1)
