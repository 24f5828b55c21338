"""Send Taskiq tasks and read what its broker keeps, with the taskiq of this Python.

    python -m tests.taskiq_app.driver kick PLAN_JSON
    python -m tests.taskiq_app.driver truth

A plan is a list of {"task": "succeed" | "sleep_for", optional "args"}; `kick` prints the epoch
seconds just before the first and just after the last was sent. `truth` prints the broker's own
view of its queue, read through its own connection pool under its own names (queue_name,
consumer_group_name): a list's length; a stream's length and its consumer group's lag, pending
entries and the id of the first entry not yet delivered. Taskiq itself has no count API.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import taskiq
from redis.asyncio import Redis
from taskiq_redis import RedisStreamBroker

from tests.taskiq_app import tasks


async def kick(plan: list[dict[str, Any]]) -> dict[str, float]:
    before = time.time()
    for step in plan:
        await getattr(tasks, step["task"]).kiq(*step.get("args", []))
    return {"before": before, "after": time.time()}


async def truth() -> dict[str, Any]:
    broker = tasks.broker
    queue = broker.queue_name
    view: dict[str, Any] = {"version": taskiq.__version__, "queue": queue}
    async with Redis(connection_pool=broker.connection_pool) as redis:
        view["now"] = time.time()
        if not isinstance(broker, RedisStreamBroker):
            view["length"] = await redis.llen(queue)
            return view
        group = next(
            entry
            for entry in await redis.xinfo_groups(queue)
            if entry["name"].decode() == broker.consumer_group_name
        )
        after = b"(" + group["last-delivered-id"]
        undelivered = await redis.xrange(queue, min=after.decode(), max="+", count=1)
        view.update(
            length=await redis.xlen(queue),
            lag=group["lag"],
            pending=group["pending"],
            first_undelivered=undelivered[0][0].decode() if undelivered else None,
        )
    return view


async def main() -> None:
    command, *args = sys.argv[1:]
    await tasks.broker.startup()  # RedisStreamBroker's makes its consumer group
    try:
        if command == "kick":
            print(json.dumps(await kick(json.loads(args[0]))))
        elif command == "truth":
            print(json.dumps(await truth()))
        else:
            raise SystemExit(f"unknown command {command}")
    finally:
        await tasks.broker.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
