"""What the exporter says it will look at: the startup report, no sources no start, unknown
variables, check-config's verdict and `--connect` against real backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from exporter.config import presets
from tests.conftest import POSTGRES_ADMIN_DSN, value
from tests.private_redis import PrivateRedis, free_port

EXPORTER = [sys.executable, "-m", "exporter"]
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command with no QUEUE_EXPORTER_* variable of this shell, only `env`'s."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_EXPORTER_")}
    return subprocess.run(
        [*EXPORTER, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})}
    )


@pytest.mark.fast
def test_serve_with_nothing_to_do_refuses_to_start_and_says_how():
    result = run_cli("serve", "--listen-address", "127.0.0.1:0")
    assert result.returncode == 1
    for hint in ("nothing to sample or consume", "--preset", "--redis-url", "--config FILE"):
        assert hint in result.stderr


@pytest.mark.fast
def test_a_misspelt_variable_is_named_with_its_likely_meaning():
    result = run_cli("serve", env={"QUEUE_EXPORTER_REDISURL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1
    assert (
        "QUEUE_EXPORTER_REDISURL: not a setting (did you mean QUEUE_EXPORTER_REDIS_URL?)"
        in result.stderr
    )


@pytest.mark.fast
def test_check_config_applies_the_environment_as_serve_does():
    env = {
        "QUEUE_EXPORTER_REDIS_URL": "redis://app:s3cr3t@redis.internal:6379/2",
        "QUEUE_EXPORTER_PRESET": "orchestrata runnerq",
        "QUEUE_EXPORTER_EVENTS_STREAM": "jobs:events",
    }
    result = run_cli("check-config", env=env)
    assert result.returncode == 0, result.stderr
    assert "s3cr3t" not in result.stdout + result.stderr
    assert "# source redis keys: redis://app:****@redis.internal:6379/2" in result.stdout
    assert "# source events: redis://app:****@redis.internal:6379/2 (2 streams)" in result.stdout
    assert "# events stream default:events_stream (runnerq, group queue-exporter)" in result.stdout
    verdict = result.stdout.splitlines()[-1]
    presets_groups = sum(
        1 for line in result.stdout.splitlines() if line.startswith("# key group ")
    )
    assert presets_groups > 2
    assert verdict == f"OK: 2 sources, {presets_groups} key groups, 2 streams, 0 SQL collectors"


@pytest.mark.fast
def test_check_config_with_nothing_to_do_fails(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("sample_interval: 5\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 1
    assert "nothing to sample or consume" in result.stderr


def test_errors_suggest_and_keep_the_file_name(tmp_path):
    path = tmp_path / "typos.yaml"
    path.write_text("sources:\n  redis:\n    key_group: []\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 1
    assert f"invalid configuration in {path}" in result.stderr
    assert "sources.redis.key_group: Extra inputs are not permitted" in result.stderr
    assert "(did you mean 'key_groups'?)" in result.stderr

    path.write_text("presets: [{name: celery, params: {queus: [a]}}]\n")
    result = run_cli("check-config", str(path))
    assert f"invalid configuration in {path}" in result.stderr
    valid = ", ".join(sorted(presets.read("celery")["params"]))
    assert "unknown params queus (did you mean 'queues'? " in result.stderr
    assert f"valid: {valid})" in result.stderr

    path.write_text("presets: [orchestrat]\n")
    result = run_cli("check-config", str(path))
    assert "unknown preset 'orchestrat' (did you mean 'orchestrata'?" in result.stderr


def test_check_config_connect_shows_what_each_backend_holds(
    redis_client, redis_url, postgres_dsn, tmp_path
):
    redis_client.rpush("jobs:email:p1", json.dumps({"at": 1_700_000_000}), "{}")
    redis_client.rpush("jobs:sms:p2", "{}")
    redis_client.xadd("jobs:events", {"event": "job.enqueued"})
    redis_client.xgroup_create("jobs:events", "queue-exporter", id="0")
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE backlog (queue text, depth int)")
        connection.execute("INSERT INTO backlog VALUES ('email', 3), ('sms', 4)")
    config = {
        "sources": {
            "redis": {
                "url": redis_url,
                "key_groups": [
                    {
                        "system": "billing",
                        "pattern": "jobs:{queue}:p{priority}",
                        "type": "list",
                        "state": "pending",
                        "oldest": {"time_in": "json", "field": "at"},
                    },
                    {
                        "system": "billing",
                        "pattern": "job:{queue}:p{priority}",  # the typo
                        "type": "list",
                        "state": "active",
                    },
                ],
            },
            "events": {"streams": ["jobs:events", "jobs:absent"]},
            "postgres": {
                "dsn": postgres_dsn,
                "collectors": [
                    {
                        "name": "backlog",
                        "query": "SELECT 'billing' AS system, queue, depth FROM backlog",
                        "labels": ["system", "queue"],
                        "values": [{"column": "depth", "metric": "queue_depth"}],
                    }
                ],
            },
        }
    }
    path = tmp_path / "config.json"  # JSON is YAML
    path.write_text(json.dumps(config))
    result = run_cli("check-config", str(path), "--connect")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "key group jobs:{queue}:p{priority} (billing, list): 2 key(s) matched e.g. " in out, out
    assert "jobs:email:p1" in out and "2 queue(s), 2 series" in out
    assert (
        'queue_depth{system="billing", queue="email", priority="1", state="pending"} 2, '
        "queue_oldest_age_seconds" in out
    )
    assert "key group job:{queue}:p{priority} (billing, list): 0 key(s) matched" in out
    assert "WARNING: matched no keys" in out
    assert "stream jobs:events: length 1, groups queue-exporter; group queue-exporter: lag 1" in out
    assert "stream jobs:absent: does not exist yet" in out
    assert "postgres:backlog: 2 row(s); series: queue_depth 2" in out
    # the item without a time and the typo: each warning named on its own line, then the verdict
    assert out.splitlines()[-3] == (
        "WARNING: key group jobs:{queue}:p{priority} (billing, list): 1 key(s) (jobs:sms:p2): "
        "the head item carries no time [time_missing]"
    )
    assert out.splitlines()[-2].startswith(
        "WARNING: key group job:{queue}:p{priority} (billing, list): matched no keys: a typo"
    )
    verdict = "OK with 2 warnings: 3 sources, 2 key groups, 2 streams, 1 SQL collector"
    assert out.splitlines()[-1] == verdict, out
    strict = run_cli("check-config", str(path), "--connect", "--strict")
    assert strict.returncode == 1
    assert strict.stdout.splitlines()[-1] == verdict


def test_check_config_connect_fails_naming_the_unreachable_backend():
    """Key groups, a stream and a native reader on one Redis that refuses: one FAILED line
    for it, and the verdict."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    presets = ("--preset", "orchestrata", "--preset", "runnerq", "--preset", "rq")
    result = run_cli("check-config", "--redis-url", url, *presets, "--connect")
    assert result.returncode == 1
    said = [line for line in result.stdout.splitlines() if not line.startswith("# ")]
    assert said[0].startswith(f"redis keys at {url}: FAILED (connection")
    assert said[1:] == [f"FAILED: redis at {url}"]


def test_check_config_summary_first_and_the_yaml_only_when_asked(tmp_path):
    args = ("check-config", "--preset", "celery", "--redis-url", "redis://celery-redis:6379/0")
    plain = run_cli(*args)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0] == "# presets: celery"
    assert "listen_address:" not in plain.stdout and len(lines) < 15
    # Celery's separator, and every key group built with it, printed so a person can see it
    assert r"# key group celery {queue}\x06\x16{_step} (list, pending)" in lines
    assert all(line.isprintable() for line in lines)
    shown = run_cli(*args, "--show-config")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.startswith("# presets: celery\n")
    assert out.index("# key group") < out.index("listen_address: 0.0.0.0:9839")
    assert shown.stdout.splitlines()[-1] == lines[-1]  # the verdict ends both


def test_check_config_warns_of_an_empty_database_and_readers_with_nothing_to_read(tmp_path):
    """An empty database (the wrong number in the URL) is not OK: each thing that answered but
    found nothing is a warning, and --strict makes them fail. A server of the test's own: the
    shared one's databases hold the test claims' markers."""
    server = PrivateRedis(tmp_path).start()
    try:
        assert server.client().dbsize() == 0
        url = server.url
        args = ("check-config", "--preset", "rq", "--redis-url", url, "--connect")
        result = run_cli(*args)
        strict = run_cli(*args, "--strict")
    finally:
        server.stop()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    warnings = [line for line in out.splitlines() if line.startswith("WARNING: ")]
    assert warnings[0].startswith(
        f"WARNING: redis at {url}: the database holds no keys at all (DBSIZE 0)"
    ), warnings
    reader = f"WARNING: native reader rq at {url}: nothing to read, no key matches rq:queues"
    assert any(line.startswith(reader) for line in warnings), warnings
    assert out.splitlines()[-1].startswith(f"OK with {len(warnings)} warnings: ")
    assert strict.returncode == 1
    assert strict.stdout.splitlines()[-1] == out.splitlines()[-1]


def test_check_config_names_the_type_a_wrong_key_holds_and_counts_keys_that_exist(
    redis_client, redis_url, tmp_path
):
    redis_client.zadd("jobs:email", {"job-1": 1.0})  # a zset where the group reads lists
    redis_client.rpush("named:a", "x", "y")  # named:b is only a name built from a value
    config = {
        "sources": {
            "redis": {
                "url": redis_url,
                "key_groups": [
                    {"system": "s", "pattern": "jobs:{queue}", "type": "list", "state": "pending"},
                    {
                        "system": "s",
                        "pattern": "nothing:{queue}",
                        "type": "list",
                        "state": "pending",
                    },
                    {
                        "system": "s",
                        "pattern": "named:{queue}",
                        "type": "list",
                        "state": "pending",
                        "values": {"queue": ["a", "b"]},
                    },
                ],
            }
        }
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_cli("check-config", str(path), "--connect")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    found_type = redis_client.type("jobs:email").decode()  # what Redis itself says it holds
    assert (
        f"WARNING: key group jobs:{{queue}} (s, list): key jobs:email holds a Redis {found_type}, "
        "the group reads a list" in out
    ), out
    assert "WARNING: key group nothing:{queue} (s, list): matched no keys" in out
    existing = sum(redis_client.exists(f"named:{queue}") for queue in ("a", "b"))
    assert (
        f"key group named:{{queue}} (s, list): {existing} key(s) matched e.g. named:a; 2 queue(s)"
        in out
    )
    assert (
        out.splitlines()[-1]
        == "OK with 2 warnings: 1 source, 3 key groups, 0 streams, 0 SQL collectors"
    )


def test_a_refusing_postgres_answers_in_one_line_within_its_connect_timeout(tmp_path):
    """A database that does not exist: one FAILED line, no pool retrying per collector."""
    wrong = make_conninfo(POSTGRES_ADMIN_DSN, dbname="no_such_database_here")
    # Far more than a check-config process takes to start and fail on a loaded host (seconds):
    # a pool retrying would take this long per collector.
    connect_timeout = 60.0
    config = {
        "presets": ["attune"],
        "sources": {"postgres": {"dsn": wrong, "connect_timeout": connect_timeout}},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    result = run_cli("check-config", str(path), "--connect")
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    output = result.stdout + result.stderr
    mentions = [
        line for line in output.splitlines() if 'no_such_database_here" does not exist' in line
    ]
    assert len(mentions) == 1, output
    assert mentions[0].startswith("postgres at ") and ": FAILED (connection: " in mentions[0]
    assert "psycopg.pool" not in output
    assert elapsed < connect_timeout  # the pool would retry for connect_timeout per collector


def test_serve_logs_what_it_looks_at_and_what_it_found(redis_client, redis_url, serve_process):
    redis_client.rpush("orchestrata:queue:billing:p2", '{"queued_at": "2026-01-01T00:00:00Z"}')
    exporter = serve_process(
        "--redis-url", redis_url, "--preset", "orchestrata", "--events-stream", "nowhere"
    )
    exporter.series_when(
        lambda s: value(s, "queue_exporter_keys_matched", pattern="orchestrata:dlq:{queue}") == 0
    )
    exporter.process.send_signal(signal.SIGTERM)
    assert exporter.process.wait(timeout=15) == 0
    _, log = exporter.process.communicate()
    for line in (
        "INFO exporter.runtime.app: presets: orchestrata",
        f"source redis keys: {redis_url} (2 key groups)",
        "key group orchestrata orchestrata:queue:{queue}:p{priority} (list, pending)",
        "events stream nowhere (v1, group queue-exporter)",
        "key group 'orchestrata:queue:{queue}:p{priority}' (system orchestrata, list): "
        "1 key(s) matched, 1 queue(s), 1 series",
        "WARNING exporter.sources.redis_keys.sampler: key group 'orchestrata:dlq:{queue}' "
        "(system orchestrata, list): matched no keys: a typo in the pattern or the wrong "
        "database, or every queue of it is empty (Redis deletes empty keys) [no_keys]",
        "events stream 'nowhere' (group queue-exporter) does not exist",
    ):
        assert line in log, log


def test_native_readers_are_sources_too():
    result = run_cli("check-config", "--preset", "rq", "--redis-url", "redis://rq-redis:6379/1")
    assert result.returncode == 0, result.stderr
    assert "# source native rq: redis://rq-redis:6379/1 (its own records)" in result.stdout
    assert result.stdout.splitlines()[-1].endswith(", 0 SQL collectors, 1 native reader")


def test_the_startup_report_masks_only_the_password(serve_process):
    url = f"redis://app:s3cr3t-pw@127.0.0.1:{free_port()}/3"  # nothing listens: it is only named
    exporter = serve_process("--redis-url", url, "--preset", "orchestrata")
    exporter.series_when(lambda series: series)  # serving: the report is written
    exporter.process.send_signal(signal.SIGTERM)
    exporter.process.wait(timeout=15)
    _, log = exporter.process.communicate()
    assert "s3cr3t-pw" not in log
    assert f"source redis keys: {url.replace('s3cr3t-pw', '****')} (2 key groups)" in log


def test_check_config_names_the_queues_found_but_not_configured(redis_url):
    """Queues a real Celery app declared (kombu's bindings) that the queues param leaves out
    are a warning naming each, before the verdict."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url}
    plan = [{"task": f"to_{queue}", "seconds": 0} for queue in ("ingest", "emails", "billing")]
    subprocess.run(
        [sys.executable, "-m", "tests.celery_app.driver", "publish", json.dumps(plan)],
        env=env, check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    preset = "celery:queues=ingest"
    result = run_cli(
        "check-config", "--redis-url", redis_url, "--preset", preset, "--connect", "--strict"
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr  # --strict: warnings fail
    left_out = [line for line in out.splitlines() if "found in Redis but not configured" in line]
    assert left_out, out
    for line in left_out:
        assert line.startswith("WARNING: key group ")
        assert "billing" in line and "emails" in line and "ingest" not in line.split(":", 2)[2]
    assert out.splitlines()[-1].startswith("OK with ")
