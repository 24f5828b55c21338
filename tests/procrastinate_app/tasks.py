"""Tasks a real `procrastinate worker` runs: succeed, fail, fail into a long retry wait, fail
once and succeed on the retry, fail on the retry too, and hold (running until a file appears). The database comes from PROCRASTINATE_DSN."""

from __future__ import annotations

import os
import time
from pathlib import Path

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("PROCRASTINATE_DSN", ""))
)


@app.task(name="send_email")
def send_email(to: str) -> str:
    return to


@app.task(name="explode")
def explode() -> None:
    raise ValueError("the task fails on purpose")


# Fails, then waits an hour before its next attempt: a retry that stays in the table.
@app.task(name="flaky", retry=procrastinate.RetryStrategy(max_attempts=3, wait=3600))
def flaky() -> None:
    raise ConnectionError("the task fails on purpose, and is retried")


# Fails on its first attempt (Procrastinate's `attempts` counts the attempts that ended), is
# retried at once and succeeds.
@app.task(name="flaky_once", pass_context=True, retry=procrastinate.RetryStrategy(max_attempts=1))
def flaky_once(context: procrastinate.JobContext) -> None:
    assert context.job is not None
    if context.job.attempts == 0:
        raise ConnectionError("the first attempt fails on purpose")


# Fails, is retried at once, and fails for good.
@app.task(name="give_up", retry=procrastinate.RetryStrategy(max_attempts=1))
def give_up() -> None:
    raise ConnectionError("every attempt fails on purpose")


@app.task(name="hold")
def hold(release: str) -> None:
    deadline = time.monotonic() + 120
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@app.task(name="nap")
def nap(seconds: float) -> None:
    time.sleep(seconds)
