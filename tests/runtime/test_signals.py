"""The main thread of `serve` sleeps until a signal comes (exporter/runtime/signals.py): at
rest it does not wake, SIGHUP is logged and ignored, SIGTERM stops it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.conftest import wait_for

# A main thread that polled every 50 ms switched ~20 times a second; one that sleeps on its
# pipe switches only for a signal. Leaves room for a stray wake-up or two (a GC, a log flush).
MOST_WAKES_AT_REST = 3
WATCHED_SECONDS = 2.0


def main_thread_switches(pid: int) -> int:
    """How many times the main thread gave up the CPU of its own accord (it blocked)."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_the_main_thread_sleeps_until_a_signal(redis_url, serve_process):
    serve = serve_process("--preset", "rq", "--redis-url", redis_url)
    # started: its sources built (after the listener) and each sampled once
    serve.series_when(lambda series: any(n == "queue_exporter_source_up" for n, _ in series))
    pid = serve.process.pid
    before = main_thread_switches(pid)
    time.sleep(WATCHED_SECONDS)
    assert main_thread_switches(pid) - before <= MOST_WAKES_AT_REST

    switched = main_thread_switches(pid)
    serve.process.send_signal(signal.SIGHUP)
    wait_for(lambda: main_thread_switches(pid) > switched)  # it woke for the signal
    serve.series_when(lambda series: series)  # and went on serving
    assert serve.process.poll() is None

    _, stderr = serve.sigterm()
    assert "received SIGHUP: ignored" in stderr
    assert "received SIGTERM, shutting down" in stderr
