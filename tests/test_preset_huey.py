"""The huey preset against real Huey and its `huey_consumer`: what Huey counts is what we serve.

Tasks are enqueued, scheduled (ahead and already due), completed, failed and retried an hour
later by Huey itself (tests/huey_app), on a RedisHuey served by a consumer for a while, a
RedisHuey never served and a PriorityRedisHuey; the truth is each huey's own pending_count(),
scheduled_count() and the due tasks among scheduled().
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Series, stop_process, wait_for, wait_until_served_as_truth

ROOT = Path(__file__).resolve().parent.parent
# Huey 3.x in the project's venv (the dev extra), 2.x in a venv of its own (scripts/setup.sh)
HUEY_PYTHONS = {"huey3": Path(sys.executable), "huey2": ROOT / ".venv/tools/huey2/bin/python"}
DUE_IN = 8  # seconds at least; more on a host slower to run the consumer (the test measures)


class Huey:
    def __init__(self, python: Path, redis_url: str, name: str, priority: bool = False) -> None:
        self.python, self.name = python, name
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "HUEY_NAME": name,
            "HUEY_PRIORITY": "1" if priority else "0",
        }

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.python, "-m", "tests.huey_app.driver", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def enqueue(self, *steps: dict[str, Any]) -> None:
        self.run("enqueue", json.dumps(list(steps)))

    def truth(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.run("truth"))
        return result

    def consumer(self) -> subprocess.Popen[bytes]:
        """The real `huey_consumer`, one worker thread."""
        command = self.python.parent / "huey_consumer"
        return subprocess.Popen(
            [command, "tests.huey_app.tasks.huey", "-w", "1", "-k", "thread"],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


@pytest.fixture(params=sorted(HUEY_PYTHONS))
def huey_python(request: pytest.FixtureRequest) -> Path:
    python = HUEY_PYTHONS[request.param]
    probe = subprocess.run([python, "-c", "import huey"], capture_output=True, check=False)
    if not python.exists() or probe.returncode != 0:
        message = f"{request.param}: no Huey at {python} (scripts/setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def _mismatches(series: Series, truths: dict[str, dict[str, Any]]) -> list[str]:
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "huey") in labels
    }
    if served != set(truths):
        found.append(f"queues {sorted(served)} != {sorted(truths)}")
    for queue, truth in truths.items():
        for state, count in (("pending", truth["pending"]), ("scheduled", truth["scheduled"])):
            depth = _value(series, "queue_depth", queue=queue, state=state)
            if depth != count:
                found.append(f"{queue} {state}: served {depth}, Huey {count}")
        due = _value(series, "queue_scheduled_due", queue=queue)
        if due != truth["due"]:
            found.append(f"{queue} due: served {due}, Huey {truth['due']}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "huey"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_as_huey_counts_it(huey_python, redis_url, run_exporter):
    # Huey puts a task with an eta on the queue; the consumer that takes it moves it to the
    # schedule, and its scheduler moves it back when due. With one worker: two complete, one
    # fails, one is retried in an hour, two wait in the schedule (an hour, and a few seconds)
    work = Huey(huey_python, redis_url, "work")
    began = time.monotonic()
    work.enqueue(
        {"task": "succeed"},
        {"task": "succeed"},
        {"task": "fail"},
        {"task": "fail_then_retry"},
        {"task": "succeed", "delay": 3600},
    )
    consumer = work.consumer()
    try:
        wait_for(lambda: work.truth()["scheduled"] == 2, timeout=120, interval=0.2)
        # The short delay must reach the schedule and the consumer stop before it is due (else
        # the consumer runs it): sent only now the consumer is running, with a delay of three
        # times what starting it and scheduling the first two took on this host, now
        due_in = max(DUE_IN, 3 * (time.monotonic() - began))
        work.enqueue({"task": "succeed", "delay": due_in})
        wait_for(lambda: work.truth()["scheduled"] == 3, timeout=120, interval=0.2)
    finally:
        stop_process(consumer, signal.SIGINT)
    # the consumer gone, three more wait in the queue and the short delay comes due
    work.enqueue(*({"task": "succeed"} for _ in range(3)))
    work_truth = wait_for(lambda: (t := work.truth())["due"] == 1 and t, timeout=due_in + 60)
    assert (work_truth["pending"], work_truth["scheduled"]) == (3, 3)
    # no consumer ever: even the delayed task is pending
    idle = Huey(huey_python, redis_url, "huey")
    idle.enqueue({"task": "succeed"}, {"task": "succeed"}, {"task": "succeed", "delay": 3600})
    # a PriorityRedisHuey: its queue is a zset
    prio = Huey(huey_python, redis_url, "prio", priority=True)
    prio.enqueue(*({"task": "succeed", "priority": p} for p in (1, 5, 10)))
    truths = {"work": work_truth, "huey": idle.truth(), "prio": prio.truth()}
    assert truths["huey"]["pending"] == 3 and truths["prio"]["pending"] == 3
    app = run_exporter(
        redis_url=redis_url,
        preset=[
            {"name": "huey", "params": {"names": ["work", "huey"]}},
            {"name": "huey", "params": {"names": ["prio"], "queue_type": "zset"}},
        ],
    )
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truths))
