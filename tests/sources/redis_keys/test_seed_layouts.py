"""The demo writes only layouts the seed documents describe (tests/seeds.py reads them).

The demo workload (exporter/demo/) runs against a Redis database and a PostgreSQL database of
this test's own; then every key it wrote for Orchestrata and Runner-Q must have a shape, a type
and contents the documents give, and its Attune tables the seed's DDL. A demo and a reader
agreeing on a layout the systems never write fails here.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from exporter.demo import sim_orchestrata
from exporter.demo.workload import Workload
from tests import seeds
from tests.conftest import REDIS_HOST, REDIS_PORT
from tests.layouts import runnerq_member

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def demo_data(redis_db: int, postgres_dsn: str) -> Iterator[tuple[redis.Redis, str]]:
    """What the demo workload wrote after a few seconds at a high rate."""
    workload = Workload(f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}", postgres_dsn, 50, 7)
    workload.check()
    workload.setup()
    stop = threading.Event()
    workload.start(stop)
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=redis_db, decode_responses=True)
    try:
        deadline = time.monotonic() + 60
        while not _every_kind_written(client) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        workload.join()
        workload.close()
    yield client, postgres_dsn
    client.close()


def _every_kind_written(client: redis.Redis) -> bool:
    wanted = ["orchestrata:queue:*", "orchestrata:msg_meta:*", "default:priority_queue"]
    wanted += ["default:processing", "default:events_stream", "activity:*"]
    return all(next(client.scan_iter(match=pattern, count=1000), None) for pattern in wanted)


def _template_of(key: str, templates: dict[str, str]) -> str | None:
    for template in templates:
        if seeds.shape(template).fullmatch(key):
            return template
    return None


def test_the_documents_agree_on_orchestratas_keys() -> None:
    """Seed 002's key builders and the reference's table name the same keys."""
    assert set(seeds.orchestrata_key_templates().values()) == set(seeds.orchestrata_key_types())


def test_the_demo_writes_orchestrata_as_seed_002_does(demo_data: tuple[redis.Redis, str]) -> None:
    client, _ = demo_data
    types = seeds.orchestrata_key_types()
    message_fields = seeds.orchestrata_fields("message_data")  # QueueManager.enqueue
    dead_letter_fields = seeds.orchestrata_fields("dlq_entry")  # move_to_dead_letter
    metadata_fields = seeds.orchestrata_metadata_fields()
    seen: set[str] = set()
    for key in client.scan_iter(match="orchestrata:*", count=1000):
        if key == sim_orchestrata.EVENTS_STREAM:
            continue  # the exporter's own lifecycle events (docs/events.md), no seed layout
        template = _template_of(key, types)
        assert template is not None, f"{key}: no key of seed 002 has this shape"
        seen.add(template)
        assert client.type(key) == types[template], key
        if template.startswith("orchestrata:queue:"):
            assert re.fullmatch(r"orchestrata:queue:[^:]+:p\d+", key), key  # p<int priority>
            for entry in client.lrange(key, 0, 20):
                assert list(json.loads(entry)) == message_fields, (key, entry)
        elif template.startswith("orchestrata:dlq:"):
            for entry in client.lrange(key, 0, 20):
                assert list(json.loads(entry)) == dead_letter_fields, (key, entry)
        else:
            assert set(client.hkeys(key)) <= metadata_fields, key
    assert {
        "orchestrata:queue:{recipient}:p{priority}",
        "orchestrata:msg_meta:{message_id}",
    } <= seen


def test_the_demo_writes_runnerq_as_its_reference_says(demo_data: tuple[redis.Redis, str]) -> None:
    client, _ = demo_data
    types = {
        template.replace("{q}", "default"): kind
        for template, kind in seeds.runnerq_key_types().items()
    }
    seen: set[str] = set()
    for key in [*client.scan_iter(match="default:*"), *client.scan_iter(match="activity:*")]:
        template = _template_of(key, types)
        assert template is not None, f"{key}: no Runner-Q key of the reference has this shape"
        seen.add(template)
        assert client.type(key) == types[template], key
        _check_runnerq_contents(client, key, template)
    wanted = {"default:priority_queue", "default:processing", "activity:{uuid}"}
    assert wanted | {"default:events_stream"} <= seen


def _check_runnerq_contents(client: redis.Redis, key: str, template: str) -> None:
    weights = seeds.runnerq_priority_weights()
    if template in ("default:priority_queue", "default:processing", "default:scheduled_activities"):
        for member, score in client.zrange(key, 0, 20, withscores=True):
            activity = _member_activity(member)
            if template == "default:priority_queue":  # floor(score / 1e6) is the priority
                assert int(score // 1_000_000) == weights[activity["priority"]], (member, score)
    elif template == "default:completed_activities":
        for member in client.zrange(key, 0, 20):
            assert UUID.fullmatch(member), member
    elif template == "default:dead_letter_queue":
        for entry in client.lrange(key, 0, 20):
            document = json.loads(entry)
            assert set(document) == {"activity", "error", "failed_at"}, entry
            assert set(seeds.runnerq_activity_fields()) <= set(document["activity"]), entry
    elif template == "default:events_stream":
        _check_runnerq_events(client, key)
    elif template == "activity:{uuid}":
        assert UUID.fullmatch(key.removeprefix("activity:")), key
        fields = client.hgetall(key)
        assert set(seeds.runnerq_hash_fields()) <= set(fields), key
        assert json.loads(fields["status"]) in seeds.runnerq_statuses(), fields["status"]
        assert json.loads(fields["priority"]) in weights, fields["priority"]


def _member_activity(member: str) -> dict[str, Any]:
    """A zset member "<uuid>:<QueuedActivity JSON>" whose JSON has the reference's fields."""
    activity_id, _, document = member.partition(":")
    activity: dict[str, Any] = json.loads(document)
    assert UUID.fullmatch(activity_id) and activity["id"] == activity_id, member
    assert set(seeds.runnerq_activity_fields()) <= set(activity), member
    return activity


def _check_runnerq_events(client: redis.Redis, key: str) -> None:
    for _, fields in client.xrange(key, count=50):
        assert list(fields) == ["event"], fields
        event = json.loads(fields["event"])
        assert list(event) == ["activity_id", "timestamp", "event_type", "worker_id", "detail"]
        assert event["event_type"] in seeds.runnerq_event_types(), event


def test_the_tests_runnerq_writer_follows_the_same_reference() -> None:
    """tests/layouts.py's member is what the check above accepts (both from the reference)."""
    from tests.layouts import runnerq_activity

    activity = runnerq_activity("send", "High", time.time() - 5)
    assert _member_activity(runnerq_member(activity)) == activity


def test_the_demos_attune_tables_are_the_seeds(demo_data: tuple[redis.Redis, str]) -> None:
    """queue_stats exactly as seed 000's CREATE TABLE (columns, types, nullability, defaults),
    the execution statuses as the reference lists them."""
    _, dsn = demo_data
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("CREATE SCHEMA seed")
        connection.execute("SET search_path TO seed, public")
        connection.execute("CREATE TABLE seed.action (id BIGSERIAL PRIMARY KEY)")
        connection.execute(seeds.attune_queue_stats_ddl("seed").replace("attune.", "seed."))
        demo, seed = (_columns(connection, schema) for schema in ("attune", "seed"))
        assert [column[0] for column in seed] == seeds.attune_queue_stats_columns()
        assert demo == seed
        (labels,) = connection.execute(
            "SELECT enum_range(NULL::attune.execution_status_enum)::text[]"
        ).fetchone() or ([],)
        assert labels == seeds.attune_execution_statuses()


def _columns(connection: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return connection.execute(
        """SELECT column_name, data_type, is_nullable, column_default
           FROM information_schema.columns
           WHERE table_schema = %s AND table_name = 'queue_stats' ORDER BY ordinal_position""",
        (schema,),
    ).fetchall()
