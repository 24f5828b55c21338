"""The dramatiq preset against real Dramatiq and its Worker: what Dramatiq says is what we serve.

Messages are enqueued, delayed, completed, failed into the dead-letter queue, retried after a
backoff and kept running by Dramatiq itself (tests/dramatiq_app). The truth is the broker's own
qsize of each queue (every message not yet acknowledged) and what Dramatiq's middleware hooks
report in both processes: each message enqueued (with its delay and creation time), started,
ended and dead-lettered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Series, stop_process, wait_for, wait_until_served_as_truth

ROOT = Path(__file__).resolve().parent.parent
# Dramatiq 2.x in the project's venv (the dev extra), 1.x in a venv of its own (scripts/setup.sh)
DRAMATIQ_PYTHONS = {
    "dramatiq2": Path(sys.executable),
    "dramatiq1": ROOT / ".venv/tools/dramatiq1/bin/python",
}


class Dramatiq:
    def __init__(self, python: Path, redis_url: str, events: Path) -> None:
        self.python, self.events = python, events
        self.major = ""
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "DRAMATIQ_EVENTS": str(events),
            "dramatiq_queue_prefetch": "1",  # one message fetched at a time
        }

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.python, "-m", "tests.dramatiq_app.driver", *args],
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

    def worker(self, queues: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [self.python, "-m", "tests.dramatiq_app.worker"],
            env={**self.env, "DRAMATIQ_QUEUES": queues},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return process

    def reported(self) -> list[dict[str, Any]]:
        text = self.events.read_text() if self.events.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def truth(self, queues: list[str]) -> dict[str, Any]:
        """Per queue: the broker's qsize, and from the hooks the messages fetched and not ended
        (active), delayed (scheduled), dead-lettered, and the creation time of the oldest
        message enqueued and not started (the next one a worker takes)."""
        result: dict[str, Any] = json.loads(self.run("truth", *queues))
        events = self.reported()
        started = {e["id"] for e in events if e["event"] == "started"}
        ended = Counter(e["queue"] for e in events if e["event"] == "ended")
        views = {}
        for queue in queues:
            delayed = [e for e in events if e["event"] == "enqueued" and e["delay"] is not None]
            waiting = [
                e["timestamp"]
                for e in events
                if e["event"] == "enqueued"
                and e["queue"] == queue
                and e["delay"] is None
                and e["id"] not in started
            ]
            active = sum(1 for e in events if e["event"] == "started" and e["queue"] == queue)
            view = {
                "active": active - ended[queue],
                "scheduled": sum(1 for e in delayed if e["queue"] == f"{queue}.DQ"),
                "dead_letter": sum(
                    1 for e in events if e["event"] == "dead_lettered" and e["queue"] == queue
                ),
                "oldest_ms": min(waiting, default=None),
            }
            view["pending"] = result["qsize"][queue] - view["active"] - view["scheduled"]
            views[queue] = view
        return {"now_ms": result["now_ms"], "queues": views, "version": result["version"]}


@pytest.fixture(params=sorted(DRAMATIQ_PYTHONS))
def dramatiq(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path):
    python = DRAMATIQ_PYTHONS[request.param]
    probe = subprocess.run([python, "-c", "import dramatiq"], capture_output=True, check=False)
    if not python.exists() or probe.returncode != 0:
        message = f"{request.param}: no Dramatiq at {python} (scripts/setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    driver = Dramatiq(python, redis_url, tmp_path / "events.jsonl")
    driver.major = request.param.removeprefix("dramatiq")
    started: list[subprocess.Popen[str]] = []
    yield driver, started
    for process in started:
        stop_process(process, signal.SIGTERM)


def _mismatches(series: Series, truth: dict[str, Any], scraped_ms: float) -> list[str]:
    found: list[str] = []
    served = {
        dict(labels)["queue"]
        for name, labels in series
        if name == "queue_depth" and ("system", "dramatiq") in labels
    }
    if served != set(truth["queues"]):
        found.append(f"queues {sorted(served)} != {sorted(truth['queues'])}")
    for queue, view in truth["queues"].items():
        for state in ("pending", "active", "scheduled", "dead_letter"):
            depth = _value(series, "queue_depth", queue=queue, state=state)
            if depth != view[state]:
                found.append(f"{queue} {state}: served {depth}, Dramatiq {view[state]}")
        age = _value(series, "queue_oldest_age_seconds", queue=queue, state="pending")
        oldest = view["oldest_ms"]
        if oldest is None:
            if age is not None:
                found.append(f"{queue}: age {age} served for no waiting message")
            continue
        earliest, latest = (truth["now_ms"] - oldest) / 1000, (scraped_ms - oldest) / 1000
        if age is None or not earliest - 0.5 <= age <= latest + 0.5:
            found.append(f"{queue} age: served {age}, Dramatiq {earliest:.1f} to {latest:.1f}")
    return found


def _value(series: Series, name: str, **labels: str) -> float | None:
    wanted = {("system", "dramatiq"), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def test_every_state_and_age_as_dramatiq_reports_them(dramatiq, redis_url, run_exporter):
    driver, started = dramatiq
    # one worker thread taking one message at a time: two complete, one fails into the
    # dead-letter queue, one fails and waits an hour for its retry, then a long one runs
    driver.enqueue(
        {"actor": "succeed"},
        {"actor": "succeed"},
        {"actor": "fail"},
        {"actor": "fail_then_retry"},
        {"actor": "sleep_for", "args": [600]},
    )
    started.append(driver.worker("default"))

    def running() -> bool:
        events = driver.reported()
        kinds = Counter(e["event"] for e in events)
        return kinds["started"] == 5 and kinds["ended"] == 4 and kinds["dead_lettered"] == 1

    wait_for(running, timeout=60, interval=0.3)
    # waiting behind the long one, created 90, 60 and 30 s ago; two delayed by an hour; and a
    # queue no worker serves nor anyone lists, found by its messages hash
    driver.enqueue(
        *({"actor": "succeed", "age": age} for age in (90, 60, 30)),
        *({"actor": "succeed", "delay": 3_600_000} for _ in range(2)),
        {"actor": "report", "age": 200},
    )
    truth = driver.truth(["default", "reports"])
    assert truth["version"].split(".")[0] == driver.major
    assert truth["queues"]["default"]["active"] == 1
    app = run_exporter(redis_url=redis_url, preset=["dramatiq"])
    wait_until_served_as_truth(app, lambda series, at: _mismatches(series, truth, at * 1000))
