"""Tasks a real `db_worker` runs: succeed, fail, and hold (running until a file appears)."""

from __future__ import annotations

import time
from pathlib import Path

from django_tasks import task


@task()
def send_email(to: str) -> str:
    return to


@task()
def explode() -> None:
    raise ValueError("the task fails on purpose")


@task()
def hold(release: str) -> None:
    deadline = time.monotonic() + 120
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


TASKS = {"send_email": send_email, "explode": explode, "hold": hold}
