"""The tests' side of the Celery application: its driver and real `celery worker` processes,
run as subprocesses against a test's own broker (a Redis URL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import stop_process

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = ROOT / ".venv/bin/python"
CELERY = ROOT / ".venv/bin/celery"


def env(
    redis_url: str, sep: str | None = None, steps: list[int] | None = None, **more: str
) -> dict[str, str]:
    """The app's environment (tests/celery_app): its broker, the transport's `sep` and
    `priority_steps` when given, and any other QE_CELERY_* setting (`more`)."""
    found = {**os.environ, "PYTHONPATH": str(ROOT), "QE_CELERY_BROKER": redis_url, **more}
    if sep is not None:
        found["QE_CELERY_SEP"] = sep
    if steps is not None:
        found["QE_CELERY_STEPS"] = ",".join(map(str, steps))
    return found


def driver(environment: dict[str, str], *args: str) -> Any:
    """A command of tests/celery_app/driver.py; what it printed, as JSON."""
    done = subprocess.run(
        [str(PYTHON), "-m", "tests.celery_app.driver", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def worker(
    environment: dict[str, str],
    queues: str,
    concurrency: int,
    log: Path | None = None,
    events: bool = True,
) -> subprocess.Popen[bytes]:
    """A real `celery worker` of `queues` (comma-separated), named `<queues>@<host>`, its pool
    `concurrency` slots, with -E unless `events` is false; with `log`, its INFO log goes there
    (each task's outcome and runtime as Celery took them)."""
    args = [CELERY, "-A", "tests.celery_app", "worker", *(["-E"] if events else []), "-Q", queues]
    args += ["-c", str(concurrency), "-n", f"{queues}@%h"]
    args += [f"--logfile={log}", "--loglevel=info"] if log else ["--loglevel=warning"]
    return subprocess.Popen(
        args, env=environment, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, signal.SIGQUIT)  # a worker ignores SIGTERM while a task runs


def recorder(environment: dict[str, str], path: Path) -> subprocess.Popen[bytes]:
    """Celery's event Receiver, appending every event the workers send to `path` (the
    driver's `events`); stop it with `stop_recorder`."""
    return subprocess.Popen(
        [str(PYTHON), "-m", "tests.celery_app.driver", "events", str(path)],
        env=environment,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def heard_from(path: Path) -> set[str]:
    """The hostnames whose heartbeats the recorder at `path` heard: it is subscribed."""
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # each line whole
    events = [json.loads(line) for line in lines]
    return {event["hostname"] for event in events if event["type"] == "worker-heartbeat"}


def stop_recorder(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, signal.SIGTERM)
