"""What the Celery hook costs a task in the worker's process, against the same task without it.

    .venv/bin/python bench/hooks_celery.py [--tasks 20000] [--rounds 5] [--caller-only]

Two Celery apps in this process, alike but for exporter.hooks.celery.install on one (its
events to a redis-server of the benchmark's own, sent by the flusher thread as in a worker).
Each runs a task that returns its argument through Celery's own tracer (`Task.apply`: the
prerun, task-init, success and postrun steps a worker's pool process runs, no broker); after a
warm-up of each (which checks both returned every result and the hooked one's events all
reached the stream), `--rounds` interleaved rounds of `--tasks` tasks; medians of the wall and
CPU time per task (this process's CPU, the flusher thread's included). The plain app's tasks
also pass the hook's receivers, which return at once for another app's task: the difference
is, if anything, a little under the hook's whole cost. The CPU includes the flusher's XADDs
(redis-py packing them); with --caller-only the flusher never runs (a buffer holding every
event), which leaves what the task's own thread pays.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import redis
from celery import Celery

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporter.hooks.celery
from bench.key_sampling import private_redis

STREAM = "bench:hooks_celery"


def make_app(name: str) -> Celery:
    app = Celery(name, broker="memory://", backend="cache+memory://")
    app.conf.task_store_eager_result = False

    @app.task(name=f"{name}.echo")  # type: ignore[untyped-decorator]
    def echo(value: int) -> int:
        return value

    app.finalize()
    return app


def run(app: Celery, tasks: int) -> tuple[float, float, int]:
    """Wall and CPU seconds per task; the sum of the results."""
    echo = app.tasks[f"{app.main}.echo"]
    total = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for value in range(tasks):
        total += echo.apply((value,)).result
    return (time.perf_counter() - wall) / tasks, (time.process_time() - cpu) / tasks, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--caller-only", action="store_true")
    args = parser.parse_args()
    events = 2 * args.tasks * (args.rounds + 1)  # started, completed
    held = {"buffer_size": events, "batch_size": events, "flush_interval": 3600.0}
    with private_redis() as url:
        plain, hooked = make_app("plain"), make_app("hooked")
        options = held if args.caller_only else {}
        hooks = exporter.hooks.celery.install(hooked, url, stream=STREAM, **options)
        expected = args.tasks * (args.tasks - 1) // 2
        for app in (plain, hooked):  # warm-up, and both do the same work
            assert run(app, args.tasks)[2] == expected, app.main
        emitter, client = hooks.emitters.get(), redis.Redis.from_url(url)
        if args.caller_only:
            assert emitter.buffered == 2 * args.tasks and emitter.dropped == 0
        else:
            assert emitter.flush(30)
            assert client.xlen(STREAM) == 2 * args.tasks and emitter.dropped == 0
        figures: dict[str, list[tuple[float, float]]] = {"plain": [], "hooked": []}
        for _ in range(args.rounds):
            for app in (plain, hooked):
                wall, cpu, _total = run(app, args.tasks)
                figures[app.main].append((wall, cpu))
            if not args.caller_only:
                emitter.flush(30)
        print(f"events dropped: {emitter.dropped}, buffered: {emitter.buffered}")
        hooks.emitters.close()  # while the server runs (--caller-only: its whole buffer)
        for name, runs in figures.items():
            walls = [f"{w * 1e6:.1f}" for w in sorted(w for w, _ in runs)]
            cpus = [f"{c * 1e6:.1f}" for c in sorted(c for _, c in runs)]
            print(f"{name}: µs per task, wall {walls}, cpu {cpus}")
        for index, label in ((0, "wall"), (1, "cpu")):
            plain_median = statistics.median(run[index] for run in figures["plain"])
            hooked_median = statistics.median(run[index] for run in figures["hooked"])
            print(
                f"hook, {label}: +{(hooked_median - plain_median) * 1e6:.1f} µs per task"
                f" ({hooked_median / plain_median:.2f}x the task without it)"
            )


if __name__ == "__main__":
    main()
