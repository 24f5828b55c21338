"""The Dramatiq hook's cost: a real Dramatiq Worker with exporter.hooks.dramatiq against the
same Worker without it, same run.

    .venv/bin/python bench/hook_dramatiq.py [--messages 5000] [--rounds 5]

Dramatiq's StubBroker (in memory: the broker's own network would only hide the difference) and
one worker thread run `--messages` messages of an actor that does nothing, each time on a new
broker: `bare` with Dramatiq's default middleware, `hook` with LifecycleEvents added in its
default configuration, its emitter sending to a redis-server of the benchmark's own. Each round
sends the messages (timed: the hook's `enqueued`), then starts the worker and waits until it
has processed them all (timed: `started`, `completed`). A warm-up of each checks that both ran
every message and that the hook sent its 3 events per message, none dropped; then `--rounds`
interleaved rounds, medians. Wall time and CPU (this process's and the redis-server's: the
flusher thread's sending included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import CostClock, private_redis
from exporter.hooks.dramatiq import LifecycleEvents

QUEUE = "bench"
STREAM = "bench:hook_dramatiq"


class Run:
    """One broker, its actor and (for `hook`) the hook, and how many messages the actor ran."""

    def __init__(self, events_url: str | None) -> None:
        self.broker = StubBroker()
        self.hook = LifecycleEvents(events_url, STREAM) if events_url else None
        if self.hook is not None:
            self.broker.add_middleware(self.hook)
        self.ran = 0

        def noop() -> None:
            self.ran += 1

        self.actor: Any = dramatiq.actor(noop, broker=self.broker, queue_name=QUEUE, max_retries=0)

    def send(self, messages: int) -> None:
        for _ in range(messages):
            self.actor.send()

    def process(self) -> None:
        worker = dramatiq.Worker(self.broker, worker_threads=1, worker_timeout=10)
        worker.start()
        self.broker.join(QUEUE, fail_fast=True)
        worker.join()
        self.worker = worker

    def close(self) -> None:
        self.worker.stop()
        if self.hook is not None:
            self.emitter = self.hook.emitter  # this process's, kept for its counts once closed
            self.emitter.close()
        self.broker.close()


def one(kind: str, clock: CostClock, events_url: str, messages: int, client: redis.Redis) -> Run:
    client.delete(STREAM)
    run = Run(events_url if kind == "hook" else None)
    clock.time(f"{kind} send", lambda: run.send(messages))
    clock.time(f"{kind} process", run.process)
    run.close()
    return run


def check(kind: str, run: Run, messages: int, client: redis.Redis) -> None:
    """Both ran every message; the hook sent 3 events a message and dropped none."""
    if run.ran != messages:
        raise SystemExit(f"{kind}: the actor ran {run.ran} of {messages} messages")
    if run.hook is not None:
        emitter = run.emitter
        if emitter.dropped or emitter.sent != 3 * messages or client.xlen(STREAM) != 3 * messages:
            raise SystemExit(f"hook: sent {emitter.sent}, dropped {emitter.dropped_by_reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of each")
    options = parser.parse_args()
    messages = options.messages
    with private_redis() as url:
        client = redis.Redis.from_url(url)
        clock = CostClock(client)
        for kind in ("bare", "hook"):  # warm-up, and the check that both do the same work
            check(kind, one(kind, clock, url, messages, client), messages, client)
        clock = CostClock(client)
        for _ in range(options.rounds):
            for kind in ("bare", "hook"):
                one(kind, clock, url, messages, client)
        print(f"{messages} messages, {options.rounds} interleaved rounds, medians (spread):")
        for phase in ("send", "process"):
            for measure in ("wall", "cpu"):
                figures = {k: clock.figures(measure, f"{k} {phase}") for k in ("bare", "hook")}
                bare, hook = (clock.median(measure, f"{k} {phase}") for k in ("bare", "hook"))
                print(
                    f"  {phase:7} {measure:4}: bare {per_message(bare, messages)}, hook"
                    f" {per_message(hook, messages)} µs/message"
                    f" [{spread(figures['bare'], messages)} | {spread(figures['hook'], messages)}]"
                    f" -> hook {hook / bare:.2f}x, +{(hook - bare) / messages * 1e6:.1f} µs"
                )


def per_message(seconds: float, messages: int) -> str:
    return f"{seconds / messages * 1e6:.1f}"


def spread(figures: list[float], messages: int) -> str:
    return f"{min(figures) / messages * 1e6:.1f}-{max(figures) / messages * 1e6:.1f}"


if __name__ == "__main__":
    main()
