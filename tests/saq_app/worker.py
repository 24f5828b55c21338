"""A real SAQ Worker on one queue, one job at a time, until SIGTERM; prints its id, then
"ready" once started.

    python -m tests.saq_app.worker REDIS_URL QUEUE
"""

from __future__ import annotations

import asyncio
import signal
import sys

from saq import Queue, Worker

from tests.saq_app.jobs import FUNCTIONS


async def main() -> None:
    url, name = sys.argv[1:]
    queue = Queue.from_url(url, name=name)
    # its stats written every second (SAQ's default: 10 s), for the native reader's test
    worker = Worker(queue, functions=FUNCTIONS, concurrency=1, timers={"worker_info": 1})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(worker.start())
    print(worker.id, flush=True)
    print("ready", flush=True)
    await stop.wait()
    await worker.stop()
    task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
