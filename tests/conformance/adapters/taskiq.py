"""Taskiq on Redis through taskiq-redis (its own venv, tests/taskiq_app): ListQueueBroker and
RedisStreamBroker with their defaults, tasks sent through the library and run by real
`taskiq worker` processes; the truth is what each broker keeps under its own names, read
through its own connection pool (taskiq has no count API): the list's length, the stream's
consumer group's lag and pending entries; ages from the moments the tasks were sent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any, ClassVar

from tests.conformance.adapters.base import ROOT, Adapter, TruthAt, fixed, require, run_json
from tests.conformance.checks import Age, Truth
from tests.conftest import descendants, stop_process, wait_for

TASKIQ_PYTHON = ROOT / ".venv/tools/taskiq/bin/python"
THREE = [{"task": "succeed"}] * 3


class TaskiqAdapter(Adapter):
    system = "taskiq"
    versions: ClassVar[tuple[Any, ...]] = ("list", "stream")  # taskiq-redis's two brokers

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TASKIQ_REDIS_URL": self.backend_url,
            "TASKIQ_BROKER": str(self.version),
        }

    def _driver(self, *args: str) -> Any:
        return run_json([TASKIQ_PYTHON, "-m", "tests.taskiq_app.driver", *args], self._env())

    def phases(self) -> Iterator[TruthAt]:
        require(TASKIQ_PYTHON, "taskiq_redis", "taskiq-redis")
        # no worker yet: three tasks wait (the driver's broker startup made the stream's group)
        sent = self._driver("kick", json.dumps(THREE))
        yield fixed(self.truth(self._driver("truth"), sent))
        # a real worker takes the three and runs them, then a long task it is running
        worker = subprocess.Popen(
            [TASKIQ_PYTHON.parent / "taskiq", "worker", "tests.taskiq_app.tasks:broker",
             "--workers", "1", "--wait-tasks-timeout", "1"],
            env=self._env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(lambda: self._drained(self._driver("truth")), timeout=60, interval=0.5)
            self._driver("kick", json.dumps([{"task": "sleep_for", "args": [600]}]))
            library = wait_for(lambda: self._running(self._driver("truth")), 60, 0.5)
            yield fixed(self.truth(library, None))
        finally:
            children = descendants(worker.pid)
            stop_process(worker, signal.SIGTERM)
            for pid in children:  # a worker process its parent left behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    @classmethod
    def not_served(cls, version: Any) -> dict[str, str]:
        if version != "list":
            return {}
        return {  # served under RedisStreamBroker (the stream run)
            "running": "ListQueueBroker's worker takes a message out of Redis (BRPOP)",
            "oldest_waiting": "ListQueueBroker's messages carry no enqueue time",
        }

    @staticmethod
    def _drained(library: dict[str, Any]) -> bool:
        if "lag" not in library:
            return library["length"] == 0
        return library["lag"] == 0 and library["pending"] == 0

    @staticmethod
    def _running(library: dict[str, Any]) -> dict[str, Any] | None:
        """The long task taken: out of the list, or delivered and not acknowledged."""
        if "lag" not in library:
            return library if library["length"] == 0 else None
        return library if library["lag"] == 0 and library["pending"] == 1 else None

    @staticmethod
    def truth(library: dict[str, Any], sent: dict[str, float] | None) -> Truth:
        """A list's length waits (no age: a message carries no enqueue time); a stream's group
        lag waits, since the first undelivered task was sent, and its pending entries are
        with a worker."""
        assert library["version"].startswith("0.13"), library["version"]
        queue = library["queue"]
        depths: dict[tuple[str, ...], float]
        ages: dict[tuple[str, ...], Age | None] = {(queue, "pending"): None}
        if "lag" not in library:
            depths = {(queue, "pending"): library["length"]}
        else:
            depths = {(queue, "pending"): library["lag"], (queue, "active"): library["pending"]}
            if library["first_undelivered"] is not None:
                assert sent is not None, library
                ages[queue, "pending"] = Age(sent["before"], sent["after"])
        return Truth(
            "taskiq", library["now"], depths, exact_states=True, ages=ages, exact_ages=True
        )
