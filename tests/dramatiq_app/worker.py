"""A real Dramatiq Worker (one thread; prefetch from $dramatiq_queue_prefetch) on the actors'
broker (the queues in $DRAMATIQ_QUEUES, else all) until SIGTERM; prints "ready" once started."""

from __future__ import annotations

import os
import signal
import threading

from dramatiq import Worker

from tests.dramatiq_app import actors


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    queues = (
        set(os.environ["DRAMATIQ_QUEUES"].split(",")) if "DRAMATIQ_QUEUES" in os.environ else None
    )
    worker = Worker(actors.broker, queues=queues, worker_threads=1, worker_timeout=100)
    worker.start()
    print("ready", flush=True)
    stop.wait()
    worker.stop(timeout=1000)


if __name__ == "__main__":
    main()
