"""The arq preset against real arq and its `arq` workers: what arq says is what we serve.

Jobs are enqueued, deferred, completed, failed, retried (deferred again) and kept running by arq
itself (tests/arq_app); the truth is arq's own queued_jobs() and Job.status() of every job in
each queue, run under arq's venv (it pins redis-py below 6).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Series, stop_process, wait_for, wait_until_served_as_truth

ROOT = Path(__file__).resolve().parent.parent
ARQ_PYTHON = ROOT / ".venv/tools/arq/bin/python"
# arq's job statuses -> ours: a running job stays in its queue's zset (arq removes it when it
# ends) among the due ones, so the preset serves it as pending; deferred ones are scheduled.
STATES = {"queued": "pending", "in_progress": "pending", "deferred": "scheduled"}


@pytest.fixture
def arq_python() -> Path:
    probe = subprocess.run([ARQ_PYTHON, "-c", "import arq"], capture_output=True, check=False)
    if not ARQ_PYTHON.exists() or probe.returncode != 0:
        message = f"no arq at {ARQ_PYTHON} (scripts/setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return ARQ_PYTHON


def _env(redis_url: str, queue: str = "arq:queue") -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "ARQ_REDIS_URL": redis_url, "ARQ_QUEUE": queue}


def _driver(python: Path, redis_url: str, *args: str) -> Any:
    done = subprocess.run(
        [python, "-m", "tests.arq_app.driver", redis_url, *args],
        capture_output=True,
        text=True,
        env=_env(redis_url),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _worker(python: Path, redis_url: str, queue: str) -> subprocess.Popen[bytes]:
    """The real `arq` command on one queue (settings: tests/arq_app/jobs.py)."""
    return subprocess.Popen(
        [python.parent / "arq", "tests.arq_app.jobs.WorkerSettings"],
        env=_env(redis_url, queue),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    """Every difference between the served series and arq's own view of each queue."""
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "arq") in labels
    }
    if served != set(truth["queues"]):
        found.append(f"queues {sorted(served)} != {sorted(truth['queues'])}")
    for queue, jobs in truth["queues"].items():
        for state in ("pending", "scheduled"):
            count = sum(1 for job in jobs if STATES[job["status"]] == state)
            depth = _value(series, "queue_depth", queue=queue, state=state)
            if depth != count:
                found.append(f"{queue} {state}: served {depth}, arq {count}")
        scores = [job["score"] for job in jobs if STATES[job["status"]] == "pending"]
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        if not scores:
            if age is not None:
                found.append(f"{queue}: age {age} served for no pending job")
            continue
        earliest = (truth["now_ms"] - min(scores)) / 1000
        latest = (scraped_ms - min(scores)) / 1000
        if age is None or not earliest - 0.5 <= age <= latest + 0.5:
            found.append(f"{queue} age: served {age}, arq {earliest:.1f} to {latest:.1f}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "arq"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_and_age_as_arq_reports_them(arq_python, redis_url, run_exporter):
    # the default queue, no worker: two jobs due since 90 s and 30 s, one deferred by an hour
    _driver(
        arq_python,
        redis_url,
        "enqueue",
        json.dumps(
            [
                {"queue": "arq:queue", "function": "succeed", "defer_until": -90},
                {"queue": "arq:queue", "function": "succeed", "defer_until": -30},
                {"queue": "arq:queue", "function": "succeed", "defer_by": 3600},
                # a queue nobody lists and no worker serves: arq records it nowhere else
                {"queue": "arq:unlisted", "function": "succeed"},
            ]
        ),
    )
    # "arq:emails", not listed: found through its worker's health-check key. One job at a
    # time: two complete, one fails, one is retried an hour later, then a long one runs and
    # holds the last two queued behind it.
    plan = [
        *({"queue": "arq:emails", "function": "succeed"} for _ in range(2)),
        {"queue": "arq:emails", "function": "fail"},
        {"queue": "arq:emails", "function": "retry_later"},
        {"queue": "arq:emails", "function": "sleep_for", "args": [600]},
        *({"queue": "arq:emails", "function": "succeed"} for _ in range(2)),
    ]
    _driver(arq_python, redis_url, "enqueue", json.dumps(plan))
    worker = _worker(arq_python, redis_url, "arq:emails")
    try:

        def settled() -> dict[str, Any] | None:
            truth = _driver(arq_python, redis_url, "truth", "arq:queue", "arq:emails")
            statuses = sorted(job["status"] for job in truth["queues"]["arq:emails"])
            return truth if statuses == ["deferred", "in_progress", "queued", "queued"] else None

        truth = wait_for(settled, timeout=60, interval=0.5)
        app = run_exporter(redis_url=redis_url, preset=["arq"])
        wait_until_served_as_truth(
            app, lambda series, at: _mismatches(series, truth, at * 1000), timeout=30
        )
    finally:
        stop_process(worker, signal.SIGTERM)
