"""`check-config --connect` finds the queues of the Redis presets of arq, Dramatiq, Huey, SAQ,
Bull, Bee-Queue and Taskiq: each system's queues written by the library itself into a database of
its own (the least-privilege test's seeds), each preset checked against its database."""

from __future__ import annotations

import pytest

from tests.commands.test_check_config import run_cli
from tests.commands.test_least_privilege_queues import PENDING, SEEDS
from tests.djangoq_app.control import DEFAULT, DjangoQ
from tests.private_redis import PrivateRedis


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory):
    """A private server, database n+1 holding the queues of the n-th system."""
    server = PrivateRedis(tmp_path_factory.mktemp("presets")).start()
    try:
        for db, seed in enumerate(SEEDS.values(), start=1):
            seed(f"redis://127.0.0.1:{server.port}/{db}", server.port, db)
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("preset", list(SEEDS))
def test_check_config_connect_names_the_queues_of_each_new_preset(seeded, preset):
    db = list(SEEDS).index(preset) + 1
    url = f"redis://127.0.0.1:{seeded.port}/{db}"
    result = run_cli("check-config", "--redis-url", url, "--preset", preset, "--connect")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    queue = PENDING[preset]
    depth = f'queue_depth{{system="{preset}", queue="{queue}", priority="", state="pending"}} 1'
    assert depth in out, out
    assert "found in Redis but not configured" not in out, out
    # and only its own system's queues: the other databases are not this one
    others = [system for system in SEEDS if system != preset]
    assert not any(f'system="{system}"' in out for system in others), out


def test_check_config_connect_names_django_q_s_queue(redis_url, tmp_path):
    """django-q2's async_task under its default cluster name: check-config --connect finds its
    broker list with no params, its depth and the age of its signed task, and names what the
    preset does not read."""
    django_q = DjangoQ(redis_url, tmp_path / "django.sqlite3")
    django_q.driver(DEFAULT, "enqueue", "succeed", "2")
    result = run_cli("check-config", "--redis-url", redis_url, "--preset", "django_q", "--connect")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    where = 'system="django_q", queue="default", priority="", state="pending"'
    assert f"queue_depth{{{where}}} 2, queue_oldest_age_seconds " in out, out
    assert "# not recorded by django_q workers: " in out, out
