"""The real BullMQ, Bull and Bee-Queue (npm, run with Node) and Sidekiq (Debian's ruby-sidekiq) the preset tests drive.

Each runs a small driver script of the tests (tests/node/bullmq.cjs, bull.cjs, bee-queue.cjs,
tests/ruby/sidekiq_driver.rb)
that writes through the library's own API and prints the library's own view of the queues as
JSON: the truth the exporter is compared with. Long-running workers are subprocesses stopped by
their pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from tests.conftest import REDIS_HOST, REDIS_PORT
from tests.tools import missing

TESTS = Path(__file__).parent
BULLMQ_MAJORS = (5, 6)
BULL_MAJORS = (3, 4)
BEE_QUEUE_MAJORS = (1, 2)


class Driver:
    """A driver script run with the library's interpreter; one command per call."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = {**os.environ, **env}
        self.started: list[subprocess.Popen[str]] = []

    def run(self, command: str, spec: object, timeout: float = 120) -> str:
        done = subprocess.run(
            [*self.argv, command, json.dumps(spec)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"{command} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def start(self, argv: list[str], ready: str = "ready") -> subprocess.Popen[str]:
        """A long-running process (a worker), returned once it printed `ready`."""
        process = subprocess.Popen(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.started.append(process)
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip() == ready:
                return process
        raise AssertionError(f"{argv[:3]} ended before it was ready: {process.stderr.read()}")

    def stop(self, process: subprocess.Popen[str], timeout: float = 30) -> str:
        """SIGTERM by pid (the library's graceful shutdown); the rest of its output."""
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        return output

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                self.stop(process)


class NodeQueues(Driver):
    """A Node queue library (tests/node/<folder>, run by tests/node/<script>): steps through its
    API, some kept running (held), and its own view of the queues (truth)."""

    def __init__(
        self, package: str, folder: str, script: str, db: int, prefix: str, port: int = REDIS_PORT
    ) -> None:
        node = shutil.which("node")
        install = TESTS / "node" / folder
        if node is None:
            missing("node (Debian package nodejs) not found")
        if not (install / "node_modules" / package).is_dir():
            missing(f"{package} in {install.relative_to(TESTS.parent)} not found")
        super().__init__([str(node), str(TESTS / "node" / script), str(install)], {})
        self.connection = {"host": REDIS_HOST, "port": port, "db": db, "prefix": prefix}

    def steps(self, *steps: dict[str, Any]) -> None:
        assert self.run("steps", {**self.connection, "steps": list(steps)}).strip() == "ready"

    def hold(self, *steps: dict[str, Any]) -> subprocess.Popen[str]:
        """Run steps whose processors keep jobs active until the process is stopped."""
        spec = {**self.connection, "steps": list(steps)}
        return self.start([*self.argv, "steps", json.dumps(spec)])

    def truth(self, queues: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            self.run("truth", {**self.connection, "queues": queues})
        )
        return result

    def finished(self, queues: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """Per queue, every completed and failed job the library keeps, by id: state, name,
        attemptsMade (as it counts them: BullMQ every attempt, Bull the failed ones),
        failedReason."""
        result: dict[str, Any] = json.loads(
            self.run("finished", {**self.connection, "queues": queues})
        )
        return dict(result["queues"])


class BullMQ(NodeQueues):
    def __init__(
        self,
        major: int,
        db: int,
        port: int = REDIS_PORT,
        cluster: list[tuple[str, int]] | None = None,
        prefix: str = "bull",
    ) -> None:
        """`cluster`: a Redis Cluster's seed nodes, which BullMQ then reaches through ioredis's
        Cluster client (db and port are not used); `prefix`: BullMQ's key prefix."""
        super().__init__("bullmq", f"bullmq{major}", "bullmq.cjs", db, prefix, port)
        if cluster is not None:
            self.connection = {
                "cluster": [{"host": h, "port": p} for h, p in cluster],
                "prefix": prefix,
            }

    def steps(self, *steps: dict[str, Any]) -> list[dict[str, Any]]:
        """Run steps; the jobs that `work` steps with `report: true` completed, as BullMQ gave
        them to the worker (queue, name, processed_on and finished_on in ms)."""
        *lines, last = self.run("steps", {**self.connection, "steps": list(steps)}).splitlines()
        assert last.strip() == "ready"
        return [json.loads(line)["completed"] for line in lines]

    def worker(self, queue: str, **options: Any) -> subprocess.Popen[str]:
        spec = {**self.connection, "queue": queue, "options": options}
        return self.start([*self.argv, "work", json.dumps(spec)])


class Bull(NodeQueues):
    """The `bull` package, 3.x or 4.x."""

    def __init__(self, major: int, db: int, prefix: str = "bull", port: int = REDIS_PORT) -> None:
        super().__init__("bull", f"bull{major}", "bull.cjs", db, prefix, port)
        self.major = major


class BeeQueue(NodeQueues):
    """The `bee-queue` package, 1.x or 2.x."""

    def __init__(self, major: int, db: int, prefix: str = "bq", port: int = REDIS_PORT) -> None:
        super().__init__("bee-queue", f"beequeue{major}", "bee-queue.cjs", db, prefix, port)
        self.major = major


class NodeResque(NodeQueues):
    """The `node-resque` package, 9.x: Resque's keys under `namespace`."""

    def __init__(self, db: int, namespace: str = "resque", port: int = REDIS_PORT) -> None:
        super().__init__("node-resque", "resque9", "resque.cjs", db, namespace, port)
        self.connection = {"host": REDIS_HOST, "port": port, "db": db, "namespace": namespace}

    def state(self) -> dict[str, Any]:
        """Its Queue API's view: queues() with length(), failed(), allDelayed(), workers(),
        allWorkingOn(), stats()."""
        result: dict[str, Any] = json.loads(self.run("truth", self.connection))
        return result


class Sidekiq(Driver):
    def __init__(self, db: int, port: int = REDIS_PORT) -> None:
        ruby, sidekiq = shutil.which("ruby"), shutil.which("sidekiq")
        if ruby is None or sidekiq is None:
            missing("ruby and sidekiq (Debian package ruby-sidekiq) not found")
        assert ruby is not None and sidekiq is not None
        env = {"REDIS_URL": f"redis://{REDIS_HOST}:{port}/{db}"}
        super().__init__([ruby, str(TESTS / "ruby" / "sidekiq_driver.rb")], env)
        self.sidekiq = sidekiq
        self.logs: list[IO[str]] = []

    def push(self, *jobs: dict[str, Any]) -> None:
        self.run("push", {"jobs": list(jobs)})

    def truth(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.run("truth", {}))
        return result

    def worker(
        self, queues: list[str], concurrency: int = 5, scheduler: bool = True
    ) -> subprocess.Popen[str]:
        """The real `sidekiq` command, its log in a file (a pipe nobody reads would fill up);
        ready once it logs that it booted. Its scheduler moves due jobs and retries to their
        queues about every second; without it they stay in their sets."""
        argv = [self.sidekiq, "-r", str(TESTS / "ruby" / "sidekiq_jobs.rb"), "-c", str(concurrency)]
        for queue in queues:
            argv += ["-q", queue]
        log = tempfile.NamedTemporaryFile("w+", prefix="sidekiq-", suffix=".log")  # noqa: SIM115
        self.logs.append(log)
        process = subprocess.Popen(
            [*argv, "-t", "5"],
            env={**self.env, "SIDEKIQ_SCHEDULER": "running" if scheduler else "held"},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.started.append(process)
        deadline = time.monotonic() + 60
        while "Booting Sidekiq" not in Path(log.name).read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sidekiq did not start: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.1)
        return process
