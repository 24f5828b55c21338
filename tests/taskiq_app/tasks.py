"""The tasks real `taskiq worker` processes run in the tests, on a taskiq-redis broker with its
defaults (queue "taskiq", consumer group "taskiq"): TASKIQ_BROKER picks ListQueueBroker
("list") or RedisStreamBroker ("stream"), TASKIQ_REDIS_URL the Redis."""

from __future__ import annotations

import asyncio
import os

from taskiq_redis import ListQueueBroker, RedisStreamBroker

URL = os.environ.get("TASKIQ_REDIS_URL", "redis://")
BROKERS = {"list": ListQueueBroker, "stream": RedisStreamBroker}
broker = BROKERS[os.environ.get("TASKIQ_BROKER", "list")](URL)


@broker.task
async def succeed() -> str:
    return "done"


@broker.task
async def sleep_for(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds
