"""The arq preset and a queue nobody lists and no live worker serves: arq names it nowhere but
in its zset's key, so it is not counted, but named (unlisted_queue) on the status page and by
`check-config --connect`; arq's own arq:abort, a zset of job ids too, is not. Jobs written by
the real arq (tests/arq_app); every state arq counts is checked by tests/conformance/."""

from __future__ import annotations

import json
import os
import subprocess
import time

from tests.commands.test_check_config import run_cli
from tests.commands.test_least_privilege_queues import _arq_python
from tests.conformance.adapters.base import ROOT
from tests.conftest import scrape_when, value


def _enqueue(url: str, plan: list[dict[str, object]]) -> list[str]:
    """The job ids arq gave the plan's jobs."""
    done = subprocess.run(
        [_arq_python(), "-m", "tests.arq_app.driver", url, "enqueue", json.dumps(plan)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout))


def test_an_unlisted_queue_is_named_not_counted(redis_client, redis_url, run_exporter):
    _, unlisted = _enqueue(
        redis_url,
        [
            {"queue": "arq:queue", "function": "succeed", "defer_until": -30},
            {"queue": "arq:unlisted", "function": "succeed", "defer_until": -60},
        ],
    )
    redis_client.zadd("arq:abort", {unlisted: time.time() * 1000})  # as Job.abort() does
    redis_client.zadd("scores", {"not-a-job": 1})  # another app's zset: no arq:job key

    app = run_exporter({"presets": ["arq"], "sources": {"redis": {"url": redis_url}}})
    series = scrape_when(app, "queue_depth", system="arq", queue="arq:queue", state="active")
    assert value(series, "queue_depth", queue="arq:queue", state="pending") == 1
    assert value(series, "queue_depth", queue="arq:queue", state="active") == 0
    assert value(series, "queue_depth", queue="arq:unlisted", state="pending") is None
    pending = next(
        report
        for report in app.health.key_groups()
        if report.system == "arq" and ("arq", "arq:queue", "", "pending") in report.example_series
    )
    assert pending.errors.get("unlisted_queue") == 1
    assert ("unlisted_queue", "arq:unlisted") in pending.failed_keys
    assert pending.last_warning is not None and "arq:unlisted" in pending.last_warning
    assert all(key != "arq:abort" for _, key in pending.failed_keys)

    result = run_cli("check-config", "--redis-url", redis_url, "--preset", "arq", "--connect")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "unlisted_queue" in out and "'arq:unlisted'" in out, out
    assert "arq:abort" not in out and "'scores'" not in out, out
    assert "OK with" in out, out
