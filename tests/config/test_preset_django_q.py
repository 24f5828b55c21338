"""What the django_q preset leaves unread, held to django-q2 itself: its tables migrated into
PostgreSQL by Django, rows written by a real `qcluster`, and the planner's word that no finished
or failed row can be read but by reading every kept row (the preset's not_recorded says so).
Depths and ages as django-q2 says them: tests/conformance/adapters/django_q.py."""

from __future__ import annotations

import json
import signal
from typing import Any

import psycopg

from exporter.config import presets
from tests.conftest import stop_process, wait_for
from tests.djangoq_app.control import DEFAULT, DjangoQ

# the django_q_task indexes django-q2 1.11's migrations make: its primary key (with Django's
# LIKE index of a varchar key) and success_index on (group, name, func) WHERE success
INDEXES = {"django_q_task_pkey", "django_q_task_id_32882367_like", "success_index"}
# what a reader of finished tasks would count: those finished since its last read, the failed
FINISHED_READS = (
    "SELECT count(*) FROM django_q_task WHERE stopped > now() - interval '1 minute'",
    "SELECT count(*) FROM django_q_task WHERE NOT success",
)


def _plan_nodes(plan: dict[str, Any]) -> list[str]:
    return [plan["Node Type"], *(n for p in plan.get("Plans", []) for n in _plan_nodes(p))]


def test_no_finished_row_of_django_q2_is_read_through_an_index(redis_url, postgres_dsn):
    django_q = DjangoQ(redis_url, postgres_dsn)
    cluster = django_q.cluster(DEFAULT)
    try:
        django_q.driver(DEFAULT, "enqueue", "succeed", "2")
        django_q.driver(DEFAULT, "enqueue", "fail", "1")

        def saved() -> bool:
            library = django_q.driver(DEFAULT, "truth")
            return library["succeeded"] == 2 and library["failed"] == 1

        wait_for(saved, timeout=60, interval=0.5)
    finally:
        stop_process(cluster, signal.SIGTERM)
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute("ANALYZE django_q_task")
        found = db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'django_q_task'")
        assert {name for (name,) in found} == INDEXES
        db.execute("SET enable_seqscan = off")  # an index the planner could use, it would
        for query in FINISHED_READS:
            (plan,) = db.execute(f"EXPLAIN (FORMAT JSON) {query}").fetchone() or [None]
            nodes = _plan_nodes((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
            assert "Seq Scan" in nodes and not any("Index" in n for n in nodes), (query, nodes)
    fragment = presets.expand("django_q")
    assert "postgres" not in fragment["sources"]
    named = fragment["not_recorded"]["django_q"]
    for signal_name in ("completed", "failed", "failed_kept"):
        assert "django_q_task" in named[signal_name] and "no index" in named[signal_name]
