"""A real SAQ Worker on one queue, one job at a time, until SIGTERM; prints "ready" once
started.

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
    worker = Worker(Queue.from_url(url, name=name), functions=FUNCTIONS, concurrency=1)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(worker.start())
    print("ready", flush=True)
    await stop.wait()
    await worker.stop()
    task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
