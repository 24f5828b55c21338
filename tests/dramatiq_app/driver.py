"""Produce Dramatiq messages and read Dramatiq's own count of each queue.

    python -m tests.dramatiq_app.driver enqueue PLAN_JSON
    python -m tests.dramatiq_app.driver truth QUEUE...

A plan is a list of {"actor", optional "args", "delay" (ms), "age" (seconds: the message was
created that long ago)}. `truth` prints, per queue, the broker's qsize (messages not yet acked:
waiting, fetched by a worker, and delayed) and Dramatiq's version.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import dramatiq

from tests.dramatiq_app import actors


def enqueue(plan: list[dict[str, Any]]) -> None:
    for step in plan:
        actor = getattr(actors, step["actor"])
        message = actor.message(*step.get("args", []))
        if "age" in step:
            message = message.copy(message_timestamp=int((time.time() - step["age"]) * 1000))
        actors.broker.enqueue(message, delay=step.get("delay"))


def truth(queues: list[str]) -> dict[str, Any]:
    sizes = {queue: actors.broker.do_qsize(queue) for queue in queues}
    return {"version": dramatiq.__version__, "now_ms": int(time.time() * 1000), "qsize": sizes}


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "enqueue":
        enqueue(json.loads(args[0]))
    elif command == "truth":
        print(json.dumps(truth(args)))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
