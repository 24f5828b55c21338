"""What the exporter says it will look at: the startup report, no sources no start, unknown
variables, check-config's verdict and `--connect` against real backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psycopg

from exporter import presets
from tests.conftest import value
from tests.private_redis import free_port

EXPORTER = [sys.executable, "-m", "exporter"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command with no QUEUE_EXPORTER_* variable of this shell, only `env`'s."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_EXPORTER_")}
    return subprocess.run(
        [*EXPORTER, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})}
    )


def test_serve_with_nothing_to_do_refuses_to_start_and_says_how():
    result = run_cli("serve", "--listen-address", "127.0.0.1:0")
    assert result.returncode == 1
    for hint in ("nothing to sample or consume", "--preset", "--redis-url", "--config FILE"):
        assert hint in result.stderr


def test_a_misspelt_variable_is_named_with_its_likely_meaning():
    result = run_cli("serve", env={"QUEUE_EXPORTER_REDISURL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1  # and, with nothing else given, nothing to do
    assert (
        "QUEUE_EXPORTER_REDISURL is not a setting, ignored "
        "(did you mean QUEUE_EXPORTER_REDIS_URL?)" in result.stderr
    )


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
    assert f"unknown params queus (valid: {valid})" in result.stderr

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
    assert out.splitlines()[-1] == "OK: 3 sources, 2 key groups, 2 streams, 1 SQL collector"


def test_check_config_connect_fails_naming_the_unreachable_backend():
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    result = run_cli("check-config", "--redis-url", url, "--preset", "orchestrata", "--connect")
    assert result.returncode == 1
    assert f"redis keys at {url}: FAILED (connection" in result.stdout
    assert result.stdout.splitlines()[-1] == f"FAILED: redis keys at {url}"


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
        "INFO exporter.app: presets: orchestrata",
        f"source redis keys: {redis_url} (2 key groups)",
        "key group orchestrata orchestrata:queue:{queue}:p{priority} (list, pending)",
        "events stream nowhere (v1, group queue-exporter)",
        "key group 'orchestrata:queue:{queue}:p{priority}' (system orchestrata, list): "
        "1 key(s) matched, 1 queue(s), 1 series",
        "WARNING exporter.sources.redis_keys: key group 'orchestrata:dlq:{queue}' "
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
