"""The broker (Dramatiq's RedisBroker on $REDIS_URL) and the actors real workers run."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

HOUR_MS = 3_600_000


class Record(Middleware):
    """Appends what the library reports to $DRAMATIQ_EVENTS, one JSON object a line."""

    def _write(self, event: str, message: Any, **more: Any) -> None:
        path = os.environ.get("DRAMATIQ_EVENTS")
        if not path:
            return
        line = {"event": event, "id": message.message_id, "queue": message.queue_name, **more}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self._write("enqueued", message, delay=delay, timestamp=message.message_timestamp)

    def before_process_message(self, broker: Any, message: Any) -> None:
        self._write("started", message)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        self._write("ended", message, failed=exception is not None)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        self._write("ended", message, failed=False)

    def after_nack(self, broker: Any, message: Any) -> None:
        self._write("dead_lettered", message)


broker = RedisBroker(url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
broker.add_middleware(Record())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="default", max_retries=0)
def succeed() -> str:
    return "done"


@dramatiq.actor(queue_name="default", max_retries=0)
def fail() -> None:
    raise RuntimeError("failing on purpose")


# one retry, an hour later: the retry waits in the delay queue
@dramatiq.actor(queue_name="default", max_retries=1, min_backoff=HOUR_MS, max_backoff=2 * HOUR_MS)
def fail_then_retry() -> None:
    raise RuntimeError("failing on purpose, once retried")


@dramatiq.actor(queue_name="default", max_retries=0, time_limit=900_000)
def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@dramatiq.actor(queue_name="reports", max_retries=0)
def report() -> str:
    return "report"


# a queue whose one message dies: only its dead letter is left of it
@dramatiq.actor(queue_name="graveyard", max_retries=0)
def doomed() -> None:
    raise RuntimeError("failing on purpose, into the dead letters")


# a queue holding only delayed messages
@dramatiq.actor(queue_name="digests", max_retries=0)
def digest() -> str:
    return "digest"
