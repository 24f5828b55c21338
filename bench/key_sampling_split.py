"""Where a key-sampling cycle's CPU goes: this process's and the redis-server's apart, and the
garbage collections a cycle runs, the exporter's cycle against bench/key_sampling.py's floor.

    .venv/bin/python bench/key_sampling_split.py [--sizes 100000,1000000] [--runs 4]
        [--before DIR]

For each size: bench/key_sampling.py's keys (N Orchestrata queue lists among 100,000 other
keys) in a redis-server of the benchmark's own; after a warm-up of each, the floor and one
cycle of the orchestrata preset in turn, `--runs` times, each cycle checked to give the
floor's series. Per run: this process's CPU (time.process_time) and the redis-server's (INFO
cpu) for each side, and the collections the cyclic GC ran during the exporter's cycle (by
generation, from gc.callbacks) and the CPU they took. The process starts as `serve` does:
what start-up built frozen (gc.freeze()). bench/key_sampling.py gives the sum of both CPUs,
the figure its target is stated in; this says which side of it moves with the number of keys.

With --before DIR (another source tree: a worktree of an earlier commit), instead: this tree's
cycle and that tree's, each in a process of its own (its exporter and bench/key_sampling.py
imported from its tree), over the same keys in the same redis-server, after a warm-up of
each: in turn, the order swapped every run, each process running the floor and then its
cycle (checked to give the floor's series), so a change is measured against what it changed
under the same load. Per run and side: this process's CPU and the redis-server's, floor and
cycle, and their ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

# A --before worker imports the exporter (and the floor) of the tree it measures
sys.path.insert(0, os.environ.get("KEY_SAMPLING_TREE") or str(Path(__file__).parent.parent))

from bench.key_sampling import (
    RawRedis,
    floor_loop,
    load_average,
    load_keys,
    preset_sampler,
    private_redis,
    same_result,
)


class Collections:
    """The cyclic GC's collections by generation, and the process CPU they took, since reset."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.cpu = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def reset(self) -> None:
        self.counts, self.cpu = [0, 0, 0], 0.0

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.cpu += time.process_time() - self._started
            self.counts[info["generation"]] += 1


def server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def warmed_up(url: str) -> tuple[Any, RawRedis]:
    """The orchestrata preset's sampler and the floor's connection, each run once, what
    start-up built frozen (gc.freeze(), as `serve` does: exporter/runtime/app.py)."""
    sampler = preset_sampler(url, "orchestrata")
    raw = RawRedis(url)
    gc.freeze()
    floor_loop(raw)
    sampler.sample()
    return sampler, raw


def floor_then_cycle(
    sampler: Any, raw: RawRedis, client: redis.Redis, between: Callable[[], None] = lambda: None
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The floor, then one cycle checked to give its series: each one's CPU, this process's
    and the redis-server's."""
    server, cpu = server_cpu(client), time.process_time()
    found = floor_loop(raw)
    floor = (time.process_time() - cpu, server_cpu(client) - server)
    between()
    server, cpu = server_cpu(client), time.process_time()
    cycle = sampler.sample()
    ours = (time.process_time() - cpu, server_cpu(client) - server)
    same_result(found, cycle.samples, 60.0)
    return floor, ours


def measure(url: str, client: redis.Redis, size: int, runs: int, collections: Collections) -> None:
    sampler, raw = warmed_up(url)
    ratios: dict[str, list[float]] = {"process": [], "redis": [], "both": []}
    for _ in range(runs):
        (floor_cpu, floor_server), (ours_cpu, ours_server) = floor_then_cycle(
            sampler, raw, client, collections.reset
        )
        counts, gc_cpu = list(collections.counts), collections.cpu
        ratios["process"].append(ours_cpu / floor_cpu)
        ratios["redis"].append(ours_server / floor_server)
        ratios["both"].append((ours_cpu + ours_server) / (floor_cpu + floor_server))
        print(
            f"{size:>9} process {floor_cpu:6.3f} s {ours_cpu:6.3f} s "
            f"({ratios['process'][-1]:.2f}x)  redis {floor_server:6.3f} s {ours_server:6.3f} s "
            f"({ratios['redis'][-1]:.2f}x)  both {ratios['both'][-1]:.2f}x  "
            f"GC {counts} {gc_cpu:.3f} s  load {load_average()}",
            flush=True,
        )
    medians = ", ".join(f"{name} {statistics.median(r):.2f}x" for name, r in ratios.items())
    print(f"{size:>9} medians, exporter / floor CPU: {medians}")
    raw.close()
    sampler.close()


def worker(url: str) -> None:
    """One side of --before: after a warm-up, on each line of stdin the floor and then one
    cycle, checked equal; each one's CPU (this process's, the redis-server's) as a JSON line."""
    client = redis.Redis.from_url(url)
    sampler, raw = warmed_up(url)
    print("ready", flush=True)
    for _ in sys.stdin:
        floor, ours = floor_then_cycle(sampler, raw, client)
        print(json.dumps({"floor": floor, "cycle": ours}), flush=True)


def before_and_after(url: str, before: str, size: int, runs: int) -> None:
    """This tree's cycle and `before`'s, alternated (--before)."""
    sides = {}
    for name, tree in (("after", Path(__file__).parent.parent), ("before", Path(before))):
        environment = {**os.environ, "KEY_SAMPLING_TREE": str(tree.resolve())}
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", url]
        sides[name] = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
        )
    ratios: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
    try:
        for name, side in sides.items():
            assert side.stdout is not None
            if side.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the {name} side did not start")
        for run in range(runs):
            for name in sides if run % 2 == 0 else reversed(sides):
                side = sides[name]
                assert side.stdin is not None and side.stdout is not None
                side.stdin.write("run\n")
                side.stdin.flush()
                line = side.stdout.readline()
                if not line:
                    raise RuntimeError(f"the {name} side failed")
                (floor, floor_server), (ours, ours_server) = json.loads(line).values()
                shown = {
                    "process": ours / floor,
                    "redis": ours_server / floor_server,
                    "both": (ours + ours_server) / (floor + floor_server),
                }
                for kind, ratio in shown.items():
                    ratios[name].setdefault(kind, []).append(ratio)
                print(
                    f"{size:>9} {name:>6}: process {floor:6.3f} s {ours:6.3f} s "
                    f"({shown['process']:.2f}x)  redis {floor_server:6.3f} s "
                    f"{ours_server:6.3f} s ({shown['redis']:.2f}x)  both {shown['both']:.2f}x  "
                    f"load {load_average()}",
                    flush=True,
                )
    finally:
        for side in sides.values():
            side.kill()
            side.wait()
    for name, kinds in ratios.items():
        medians = ", ".join(
            f"{kind} {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"
            for kind, r in kinds.items()
        )
        print(f"{size:>9} {name:>6} medians (range), cycle / floor CPU: {medians}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--unrelated", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--before", help="another source tree, its cycle alternated with this")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a --before side, on this URL
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    print(f"{'keys':>9} CPU: floor, exporter (ratio)")
    collections = Collections()
    with private_redis() as url:
        client = redis.Redis.from_url(url)
        for size in (int(s) for s in args.sizes.split(",")):
            load_keys(client, size, args.unrelated)
            if args.before:
                before_and_after(url, args.before, size, args.runs)
            else:
                measure(url, client, size, args.runs, collections)
        client.close()


if __name__ == "__main__":
    main()
