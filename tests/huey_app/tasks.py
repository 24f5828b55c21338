"""Hueys and their tasks. $HUEY_NAME names the module's `huey` (what `huey_consumer` runs),
$HUEY_PRIORITY=1 makes it a PriorityRedisHuey; $REDIS_URL is where it lives."""

from __future__ import annotations

import os
from typing import Any

from huey import PriorityRedisHuey, RedisHuey


def make(name: str, priority: bool) -> tuple[Any, dict[str, Any]]:
    """A huey and its tasks by name."""
    kind = PriorityRedisHuey if priority else RedisHuey
    app = kind(name, url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))

    @app.task()
    def succeed() -> str:
        return "done"

    @app.task()
    def fail() -> None:
        raise RuntimeError("failing on purpose")

    @app.task(retries=1, retry_delay=3600)  # its retry waits an hour in the schedule
    def fail_then_retry() -> None:
        raise RuntimeError("failing on purpose, retried in an hour")

    return app, {"succeed": succeed, "fail": fail, "fail_then_retry": fail_then_retry}


huey, TASKS = make(os.environ.get("HUEY_NAME", "huey"), os.environ.get("HUEY_PRIORITY") == "1")
