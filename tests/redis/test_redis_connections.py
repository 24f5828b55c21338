"""Connection forms: rediss:// with a CA and a client certificate, ACL user, password file,
unix socket, each against a redis-server of the test's own."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis

from exporter.redis.connection import RedisConnectionConfig
from tests.conftest import REDIS_HOST, REDIS_PORT, scrape_when, value
from tests.private_redis import PrivateRedis, free_port
from tests.tcp_proxy import TcpProxy
from tests.timing import wake_up_lag


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def certificates(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=tmp_path,
    )
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=tmp_path,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-copy_extensions",
            "copy",
            "-out",
            f"{name}.crt",
            cwd=tmp_path,
        )
    return tmp_path


@pytest.fixture
def secured_redis(tmp_path, certificates):
    tls_port = free_port()
    server = PrivateRedis(
        tmp_path,
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(certificates / "server.crt"),
        "--tls-key-file",
        str(certificates / "server.key"),
        "--tls-ca-cert-file",
        str(certificates / "ca.crt"),
        "--tls-auth-clients",
        "yes",
        "--unixsocket",
        str(tmp_path / "redis.sock"),
        "--unixsocketperm",
        "700",
        "--requirepass",
        "default-pw",
    ).start()
    admin = server.client(password="default-pw")
    admin.execute_command("ACL", "SETUSER", "sampler", "on", ">sampler-pw", "~*", "+@all")
    admin.rpush("orchestrata:dlq:billing", "{}", "{}")
    admin.close()
    server.tls_port = tls_port
    yield server
    server.stop()


def _dead_letters(run_exporter, redis_source):
    app = run_exporter({"presets": ["orchestrata"], "sources": {"redis": redis_source}})
    series = scrape_when(app, "queue_depth", queue="billing")
    return value(series, "queue_depth", queue="billing", state="dead_letter")


def test_tls_with_client_certificate(secured_redis, certificates, run_exporter):
    source = {
        "url": f"rediss://127.0.0.1:{secured_redis.tls_port}/0",
        "password": "default-pw",
        "tls_ca_file": str(certificates / "ca.crt"),
        "tls_cert_file": str(certificates / "client.crt"),
        "tls_key_file": str(certificates / "client.key"),
    }
    assert _dead_letters(run_exporter, source) == 2


def test_acl_user_with_password_file(secured_redis, tmp_path, run_exporter):
    password_file = tmp_path / "redis-password"
    password_file.write_text("sampler-pw\n")
    source = {"url": secured_redis.url, "username": "sampler", "password_file": str(password_file)}
    assert _dead_letters(run_exporter, source) == 2


def test_unix_socket(secured_redis, tmp_path, run_exporter):
    source = {"url": f"unix://{tmp_path / 'redis.sock'}?db=0", "password": "default-pw"}
    assert _dead_letters(run_exporter, source) == 2


def test_wrong_password_marks_the_source_down(secured_redis, run_exporter):
    app = run_exporter(
        {
            "presets": ["orchestrata"],
            "sources": {"redis": {"url": secured_redis.url, "password": "wrong"}},
        }
    )
    series = scrape_when(app, "queue_exporter_source_errors_total", reason="auth")
    assert value(series, "queue_exporter_source_up", source="redis") == 0


@pytest.fixture
def frozen_proxy():
    """A TCP proxy in front of the test Redis, frozen by the test: sockets open, nothing moves."""
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    yield proxy
    proxy.cut()


def test_a_command_to_a_frozen_server_fails_once_within_its_socket_timeout(frozen_proxy, redis_db):
    timeout = 0.5
    connection = RedisConnectionConfig(
        url=f"redis://127.0.0.1:{frozen_proxy.port}/{redis_db}", socket_timeout=timeout
    )
    client = connection.connect()
    assert client.ping()
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    frozen_proxy.freeze()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    # One timeout, not redis-py's default of ten retries of it.
    assert time.monotonic() - started < 3 * timeout + 5 * lag
    frozen_proxy.thaw()
    assert client.ping()  # the next call reconnects by itself
    client.close()


def test_connecting_to_a_frozen_server_fails_within_its_connect_timeout(frozen_proxy, redis_db):
    timeout = 0.5
    frozen_proxy.freeze()  # the TCP connection opens; the server never answers SELECT
    connection = RedisConnectionConfig(
        url=f"redis://127.0.0.1:{frozen_proxy.port}/{redis_db}",
        socket_timeout=timeout,
        connect_timeout=timeout,
    )
    client = connection.connect()
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert time.monotonic() - started < 3 * timeout + 5 * lag
    client.close()
