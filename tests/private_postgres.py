"""A PostgreSQL server of the test's own (initdb in a temp dir, a free port), for what the
shared one cannot be made to do: TLS that asks for a client certificate. The tests run as root
and PostgreSQL refuses to, so it runs as the `postgres` user; it is stopped by its pid."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.conftest import wait_for
from tests.private_redis import free_port
from tests.tls_certs import Pki

BIN = Path("/usr/lib/postgresql")
AS_POSTGRES = ("runuser", "-u", "postgres", "--")


def _binary(name: str) -> str:
    found = sorted(BIN.glob(f"*/bin/{name}"))
    if not found:
        raise RuntimeError(f"{name} not found under {BIN} (apt-get install postgresql)")
    return str(found[-1])


class TlsPostgres:
    """Accepts only TLS connections from 127.0.0.1 with a client certificate `pki`'s CA
    signed (pg_hba: hostssl ... clientcert=verify-ca), serving its own server.crt."""

    def __init__(self, pki: Pki) -> None:
        self.port = free_port()
        # not under pytest's tmp_path: its parents are root's alone, the server could not enter
        self.directory = Path(tempfile.mkdtemp(prefix="qe-tls-postgres-"))
        self._pki = pki
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> TlsPostgres:
        owner = pwd.getpwnam("postgres")
        data = self.directory / "data"
        os.chown(self.directory, owner.pw_uid, owner.pw_gid)
        subprocess.run(
            [*AS_POSTGRES, _binary("initdb"), "-D", str(data), "-A", "trust", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        for name in ("server.crt", "server.key", "ca.crt"):
            shutil.copyfile(self._pki.path(name), data / name)
            os.chown(data / name, owner.pw_uid, owner.pw_gid)
            os.chmod(data / name, 0o600)
        (data / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n"
        )
        self._process = subprocess.Popen(
            [
                *AS_POSTGRES,
                *(_binary("postgres"), "-D", str(data), "-p", str(self.port)),
                *("-k", str(self.directory), "-c", "listen_addresses=127.0.0.1"),
                *("-c", "ssl=on", "-c", "ssl_cert_file=server.crt"),
                *("-c", "ssl_key_file=server.key", "-c", "ssl_ca_file=ca.crt", "-c", "fsync=off"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=30)
        return self

    def _answers(self) -> bool:
        try:  # over the socket: the TCP port wants a client certificate
            with psycopg.connect(host=str(self.directory), port=self.port, user="postgres"):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """A fast shutdown of the postmaster (its pid from postmaster.pid), then the files."""
        pid_file = self.directory / "data" / "postmaster.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        if self._process is not None:
            self._process.wait(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)
