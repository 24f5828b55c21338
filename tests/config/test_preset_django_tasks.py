"""The django_tasks preset's plans on django-tasks-db's own table (its migrations, run by the
djangotasks venv): what runs every cycle reads no finished row."""

from __future__ import annotations

import psycopg

from exporter.config import presets
from tests.commands.test_check_config import run_cli
from tests.conformance.adapters.django_tasks import FINISHED_INDEX, DjangoTasks

TABLE = "django_tasks_database_dbtaskresult"
QUEUES = ("default", "emails", "slow", "idle")  # the test project's (tests/django_tasks_app)


def test_every_cycle_reaches_the_waiting_tasks_through_the_backend_s_indexes(
    postgres_dsn: str,
) -> None:
    """With a finished history as a busy deployment keeps it, the collectors that run every
    cycle find the queues through the queue_name index and the READY rows through the partial
    index on them: no sequential scan of the table. The one that cannot (running, failed and
    completed tasks: no index holds them apart) runs on its own longer interval, stated with
    why."""
    django = DjangoTasks(postgres_dsn)
    django.run("migrate")
    django.enqueue(
        *({"task": "send_email", "queue": QUEUES[n % 4], "args": ["x"]} for n in range(20))
    )
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        # The finished history (its shape only matters to the planner): written in bulk.
        connection.execute(
            f"INSERT INTO {TABLE} (id, status, args_kwargs, priority, task_path, queue_name,"
            " backend_name, run_after, enqueued_at, started_at, finished_at,"
            " exception_class_path, traceback, worker_ids)"
            " SELECT gen_random_uuid(),"
            " CASE WHEN n % 10 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END, '{}', 0, 't',"
            " (ARRAY['default', 'emails', 'slow', 'idle'])[1 + n % 4], 'default', '9999-01-01', now(), now(), now(), '', '', '[]'"
            " FROM generate_series(1, 200000) AS n"
        )
        connection.execute("ANALYZE")
        collectors = presets.expand("django_tasks")["sources"]["postgres"]["collectors"]
        every_cycle = [c for c in collectors if "interval" not in c]
        assert [c["name"] for c in collectors if c not in every_cycle] == ["django_tasks_kept"]
        kept = next(c for c in collectors if c["name"] == "django_tasks_kept")
        assert kept["interval"] >= 10 and kept["interval_reason"], kept
        for collector in every_cycle:
            plan = "\n".join(row[0] for row in connection.execute(f"EXPLAIN {collector['query']}"))
            assert f"Seq Scan on {TABLE}" not in plan, plan
            assert "tasks_db_new_ordering_idx" in plan, plan


def test_finished_tasks_are_read_only_through_an_index_on_finished_at(postgres_dsn: str) -> None:
    """django-tasks-db makes no index on finished_at: the native reader then says why and reads
    nothing; once the operator made one (FINISHED_INDEX), its baseline and its reads reach the
    finished rows through it, never by a sequential scan."""
    django = DjangoTasks(postgres_dsn)
    django.run("migrate")
    finished = presets.expand("django_tasks")["sources"]["postgres"]["finished"][0]
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(
            f"INSERT INTO {TABLE} (id, status, args_kwargs, priority, task_path, queue_name,"
            " backend_name, run_after, enqueued_at, started_at, finished_at,"
            " exception_class_path, traceback, worker_ids)"
            " SELECT gen_random_uuid(), 'SUCCESSFUL', '{}', 0, 't', 'default', 'default',"
            " '9999-01-01', now(), now(), now() - n * interval '1 millisecond', '', '', '[]'"
            " FROM generate_series(1, 200000) AS n"
        )
        connection.execute("ANALYZE")
        row = connection.execute(finished["unavailable_when"]).fetchone()
        assert row is not None and "no index led by finished_at" in row[0], row
        connection.execute(FINISHED_INDEX)
        connection.execute("ANALYZE")
        assert connection.execute(finished["unavailable_when"]).fetchone() == (None,)
        row = connection.execute(finished["baseline"]).fetchone()
        assert row is not None and row[0] is not None
        read = (
            finished["query"]
            .replace("{after_id}", "NULL")
            .replace("{after}", str(row[0] - 100_000))
            .replace("{limit}", "10000")
        )
        for query in (finished["baseline"], read):
            plan = "\n".join(r[0] for r in connection.execute(f"EXPLAIN {query}"))
            assert f"Seq Scan on {TABLE}" not in plan, plan
            assert "django_tasks_finished_idx" in plan, plan


def test_check_config_says_the_finished_tasks_go_uncounted_until_finished_at_is_indexed(
    postgres_dsn: str,
) -> None:
    """Without the operator's index on finished_at the native reader counts nothing: the
    verdict is a warning naming the index to make, not OK; once made, the reader reads."""
    DjangoTasks(postgres_dsn).run("migrate")
    args = ("check-config", "--postgres-dsn", postgres_dsn, "--preset", "django_tasks", "--connect")
    before = run_cli(*args)
    assert before.returncode == 0, before.stdout + before.stderr
    assert "native:django_tasks: silent (django-tasks-db indexes no finished row" in before.stdout
    assert "OK with 1 warning" in before.stdout, before.stdout
    assert "CREATE INDEX CONCURRENTLY django_tasks_finished_idx" in before.stdout
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(FINISHED_INDEX)
    after = run_cli(*args)
    assert after.returncode == 0, after.stdout + after.stderr
    assert f"native:django_tasks: reads {TABLE} (its baseline answered)" in after.stdout
    assert "warning" not in after.stdout, after.stdout
