"""A redis-server of the test's own (a free port, a temp dir), for tests that stop or reconfigure it."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil
import redis

from tests.claims import claim_port


def free_port() -> int:
    """A port nothing listens on now, claimed for this process (tests/claims.py): no other test
    process is handed it while this one lives. Drawn below the ephemeral range: a port of that
    range, free while its server is stopped, can become the local port of any outgoing
    connection, and the server started again on it (a test restarting its Redis) then fails to
    bind (seen in CI). Drawn by a generator of its own: a test seeding `random` cannot repeat it."""
    draw = random.SystemRandom()
    for _ in range(1000):
        port = draw.randrange(10_000, ephemeral_low())
        if is_free(port) and claim_port(port):
            return port
    raise RuntimeError("no free port left to claim")


def ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PrivateRedis:
    def __init__(
        self,
        directory: Path,
        *extra_args: str,
        port: int | None = None,
        binary: str | None = None,
    ) -> None:
        self.directory = directory
        self.chose_port = port is None
        self.port = port or free_port()
        self.extra_args = extra_args
        self.binary = binary or shutil.which("redis-server") or "redis-server"
        self.process: subprocess.Popen[bytes] | None = None
        self._why = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        """Start the server and prove, before any use, that what answers on the port is this
        process (INFO's process_id; the listening socket's owner for a TLS-only server): a port
        taken by another server meanwhile is traded for a new one when this object chose it."""
        for _ in range(5):
            process = self._spawn()
            self.process = process
            if self._wait_until_own(process):
                return self
            self.stop()
            if not self.chose_port or str(self.port) in self.extra_args:
                raise RuntimeError(f"port {self.port} is another process's: {self._why}")
            self.port = free_port()
        raise RuntimeError(f"redis-server found no port of its own ({self._why})")

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _wait_until_own(self, process: subprocess.Popen[bytes]) -> bool:
        """True once the port answers as `process`; False when another process has it.
        Raises when the server exits for another reason or never answers."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:  # said now, not after waiting out the deadline
                self._why = f"redis-server exited ({process.returncode})"
                if self._listener_pid() is not None:
                    return False  # its port was taken: a bind error
                message = f"redis-server on port {self.port} exited ({process.returncode})"
                raise RuntimeError(message + ": an argument refused?")
            answering = self._answering_pid()
            if answering is not None:
                self._why = f"process {answering} answers there, not {process.pid}"
                return answering == process.pid
            time.sleep(0.02)
        raise RuntimeError(f"private redis-server on port {self.port} did not start")

    def _answering_pid(self) -> int | None:
        """The process id of what serves the port: INFO's, or (no plain TCP) the listener's."""
        if "--tls-port" in self.extra_args:
            return self._listener_pid()
        password = self._argument("--requirepass")
        try:
            with redis.Redis(
                host="127.0.0.1", port=self.port, password=password, socket_timeout=2
            ) as client:
                info = client.info("server")
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return None  # not listening yet
        except redis.RedisError:  # INFO refused (an ACL file, a password not given here)
            return self._listener_pid()
        return int(info["process_id"])

    def _listener_pid(self) -> int | None:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == self.port:
                return connection.pid
        return None

    def _argument(self, name: str) -> str | None:
        arguments = list(self.extra_args)
        return arguments[arguments.index(name) + 1] if name in arguments else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]
