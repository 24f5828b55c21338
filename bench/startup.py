"""Start-up: `queue-exporter serve` with one preset to its first 200, against a bare http.server.

    .venv/bin/python bench/startup.py [--runs 9] [--preset orchestrata] [--before DIR]

A redis-server of the benchmark's own holds one queue of the preset. Each run starts a fresh
process and polls its /metrics every few milliseconds until it answers 200; the time from
spawning the process to that answer is the start-up. The floor is the leanest Python process
that answers HTTP: `python -m http.server`, started and polled the same way. A third
contender runs the same server after importing the libraries `serve` loads before its first
answer (Tornado, pydantic with one model built, yaml, click): the floor of any start-up built
on them. They alternate (after a warm-up run of each, which fills the page cache), so a
busy host slows them alike; medians and their ratios are printed. Each must answer 200, and
the exporter's first body must carry its own metrics, or the run fails.

`--before DIR` also runs the exporter of another source tree (a checkout of an earlier
commit, say) in the same rounds, so a change is measured against what it changed under the
same load.

Both run from compiled bytecode, as an installed package does (pip compiles it; the Dockerfile
writes nothing at run time): the warm-up writes it under a bytecode directory of the
benchmark's own (PYTHONPYCACHEPREFIX), whatever PYTHONDONTWRITEBYTECODE says.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.at_rest import LIBRARIES
from bench.key_sampling import private_redis
from tests.private_redis import free_port

POLL_SECONDS = 0.005
GIVE_UP_SECONDS = 30.0
CHILD_ENVIRONMENT = dict(os.environ)


class Timing(NamedTuple):
    wall: float  # spawn to the first 200
    cpu: float  # the process's CPU time, user and system, to its exit right after
    body: bytes


def first_answer(command: list[str], url: str) -> Timing:
    """Spawn `command`, poll `url` until it answers 200, stop the process."""
    cpu_before = _children_cpu()
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENVIRONMENT
    )
    try:
        while time.perf_counter() - started < GIVE_UP_SECONDS:
            if process.poll() is not None:
                raise RuntimeError(f"{command[2:4]} exited with {process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        wall, body = time.perf_counter() - started, response.read()
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(POLL_SECONDS)
        else:
            raise RuntimeError(f"no 200 from {url} within {GIVE_UP_SECONDS} s")
    finally:
        process.terminate()
        process.wait(timeout=10)
    return Timing(wall, _children_cpu() - cpu_before, body)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exporter_run(redis_url: str, preset: str, tree: str = "") -> Timing:
    """`serve` of this tree, or of `tree` (its exporter package first on the path)."""
    port = free_port()
    arguments = ["serve", "--redis-url", redis_url, "--preset", preset]
    arguments += ["--listen-address", f"127.0.0.1:{port}"]
    start = ["-c", _RUN_FROM_TREE.format(tree=tree)] if tree else ["-m", "exporter"]
    command = [sys.executable, *start, *arguments]
    timing = first_answer(command, f"http://127.0.0.1:{port}/metrics")
    if b"queue_exporter_build_info" not in timing.body:
        raise SystemExit("the exporter's first 200 carried none of its own metrics")
    return timing


# `python -c` with the other tree first on sys.path, then serve's arguments as its argv.
_RUN_FROM_TREE = (
    "import runpy, sys; sys.path.insert(0, {tree!r}); "
    "runpy.run_module('exporter', run_name='__main__')"
)


def bare_run() -> Timing:
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    return first_answer(command, f"http://127.0.0.1:{port}/")


# The libraries `serve` loads before its first answer (Tornado, pydantic with a model built,
# yaml, click), then the bare server: the floor of any start-up built on them.
_LIBRARIES_THEN_BARE = "\n".join(
    (
        *(LIBRARIES[name] for name in ("Tornado", "pydantic (one model)", "yaml, click")),
        "import runpy, sys",
        "sys.argv = ['http.server', *sys.argv[1:]]",
        "runpy.run_module('http.server', run_name='__main__')",
    )
)


def libraries_run() -> Timing:
    port = free_port()
    command = [sys.executable, "-c", _LIBRARIES_THEN_BARE, str(port), "--bind", "127.0.0.1"]
    return first_answer(command, f"http://127.0.0.1:{port}/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--preset", default="orchestrata")
    parser.add_argument("--before", default="", help="another source tree's exporter, too")
    args = parser.parse_args()
    CHILD_ENVIRONMENT.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    CHILD_ENVIRONMENT.pop("PYTHONDONTWRITEBYTECODE", None)

    with tempfile.TemporaryDirectory() as bytecode, private_redis() as redis_url:
        CHILD_ENVIRONMENT["PYTHONPYCACHEPREFIX"] = bytecode
        redis.Redis.from_url(redis_url).rpush("orchestrata:queue:mail:p1", '{"queued_at": 1}')
        exporter_run(redis_url, args.preset)  # warm-ups: bytecode written, page cache filled
        if args.before:
            exporter_run(redis_url, args.preset, args.before)
        bare_run()
        libraries_run()
        exporter_runs, bare_runs, before_runs, libraries_runs = [], [], [], []
        for _ in range(args.runs):
            exporter_runs.append(exporter_run(redis_url, args.preset))
            bare_runs.append(bare_run())
            libraries_runs.append(libraries_run())
            if args.before:
                before_runs.append(exporter_run(redis_url, args.preset, args.before))

    print(f"{args.runs} runs each, interleaved; medians of the wall time from spawn to the first")
    print("200, and of the CPU time the process used (user + system, to its exit just after):")
    print(f"{'':36} {'wall':>8} {'CPU':>8}")
    rows = [("python -m http.server", bare_runs), ("  after serve's libraries", libraries_runs)]
    rows.append((f"serve --preset {args.preset}", exporter_runs))
    if args.before:
        rows.append((f"serve --preset {args.preset} (before)", before_runs))
    for name, runs in rows:
        print(f"{name:36} {_median(runs, 'wall'):7.3f}s {_median(runs, 'cpu'):7.3f}s")
    for measure in ("wall", "cpu"):
        ratio = _median(exporter_runs, measure) / _median(bare_runs, measure)
        print(f"exporter / bare ({measure}): {ratio:.2f}x")
        if args.before:
            ratio = _median(before_runs, measure) / _median(bare_runs, measure)
            print(f"before / bare ({measure}): {ratio:.2f}x")
        ratio = _median(libraries_runs, measure) / _median(bare_runs, measure)
        print(f"libraries' floor / bare ({measure}): {ratio:.2f}x")


def _median(runs: list[Timing], measure: str) -> float:
    return statistics.median(getattr(run, measure) for run in runs)


if __name__ == "__main__":
    main()
