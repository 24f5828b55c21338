"""The tests' side of the SAQ application: run the driver and workers as subprocesses (the
pytest process never imports SAQ)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def driver(redis_url: str, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "tests.saq_app.driver", redis_url, *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout) if done.stdout else None


def worker(redis_url: str, queue: str) -> tuple[subprocess.Popen[str], str]:
    """A real SAQ Worker on `queue`, once started, and its id."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.saq_app.worker", redis_url, queue],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    worker_id = process.stdout.readline().strip()
    assert process.stdout.readline().strip() == "ready", worker_id
    return process, worker_id
