"""Secrets never leave the process: planted passwords are searched for in everything it says.

Distinctive secrets (a Redis password in the URL and in a password file, a PostgreSQL DSN
password, a basic-auth password) are given to a real `queue-exporter serve` logging at debug
level, while the backends accept, reject or cannot be reached; then its stderr, stdout,
/metrics, /readyz and the status page, `check-config` output and the errors of bad
configurations are searched for them.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from click.testing import CliRunner

from exporter.commands.cli import main
from tests.conftest import parse_exposition, wait_for
from tests.private_redis import PrivateRedis, free_port

REDIS_URL_SECRET = "Rurl-5e1f0c-planted"
REDIS_FILE_SECRET = "Rfile-5e1f0c-planted"
POSTGRES_SECRET = "Pdsn-5e1f0c-planted"
BASIC_AUTH_SECRET = "Bauth-5e1f0c-planted"
WRONG_BASIC_AUTH = "Bwrong-5e1f0c-planted"
SECRETS = (
    REDIS_URL_SECRET,
    REDIS_FILE_SECRET,
    POSTGRES_SECRET,
    BASIC_AUTH_SECRET,
    WRONG_BASIC_AUTH,
)
MARKER = "5e1f0c"  # shared by every secret: any fragment of one found is a leak

COLLECTOR = {
    "name": "probe",
    "query": "SELECT 1 AS v",
    "values": [{"column": "v", "metric": "qe_probe"}],
}


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} leaked in {where}"
    assert MARKER not in text, f"part of a secret leaked in {where}"


def _auth(password: str) -> dict[str, str]:
    token = base64.b64encode(f"prometheus:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def web_config_file(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(BASIC_AUTH_SECRET.encode(), bcrypt.gensalt(4)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    return path


@pytest.fixture
def locked_redis(tmp_path: Path):
    """A redis-server whose default user's password is the planted URL secret."""
    server = PrivateRedis(tmp_path, "--requirepass", REDIS_URL_SECRET).start()
    yield server
    server.stop()


def serve_and_collect(
    tmp_path: Path,
    config: dict[str, Any],
    until: Any,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> list[tuple[str, str]]:
    """Run `queue-exporter serve` at debug level until `until(series)`; everything it said."""
    port = free_port()
    config = {
        **config,
        "listen_address": f"127.0.0.1:{port}",
        "sample_interval": 0.2,
        "log_level": "debug",
    }
    config_path = tmp_path / "config.yml"
    config_path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--config", str(config_path), *extra_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        text=True,
    )
    outputs: list[tuple[str, str]] = []
    try:
        wait_for(lambda: _reachable(port), timeout=30)
        good = _auth(BASIC_AUTH_SECRET)
        wait_for(lambda: until(parse_exposition(_get(port, "/metrics", good)[1])), timeout=30)
        for path in ("/metrics", "/readyz", "/", "/status.json"):
            for headers in (good, _auth(WRONG_BASIC_AUTH), None):
                status, body = _get(port, path, headers)
                outputs.append((f"{path} ({status})", body))
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    outputs += [("stdout", stdout), ("stderr", stderr)]
    assert "DEBUG" in stderr or '"level": "debug"' in stderr  # debug logging was on
    return outputs


def _reachable(port: int) -> bool:
    try:
        return _get(port, "/healthz")[0] == 200
    except OSError:
        return False


def _errors(series: dict, source_prefix: str) -> float:
    return sum(
        v
        for (name, labels), v in series.items()
        if name == "queue_exporter_source_errors_total"
        and dict(labels).get("source", "").startswith(source_prefix)
    )


def _up(series: dict, source: str) -> float | None:
    return series.get(("queue_exporter_source_up", frozenset({("source", source)})))


def test_serve_with_backends_accepting_and_rejecting(
    tmp_path, locked_redis, web_config_file, postgres_dsn
):
    password_file = tmp_path / "redis-password"
    password_file.write_text(REDIS_FILE_SECRET + "\n")  # the wrong password: rejected
    plain_url = f"redis://127.0.0.1:{locked_redis.port}/0"
    config = {
        "web_config_file": str(web_config_file),
        "presets": ["orchestrata"],
        "sources": {
            "redis": {"url": f"redis://default:{REDIS_URL_SECRET}@127.0.0.1:{locked_redis.port}/0"},
            "events": {
                "streams": ["qe:events"],
                "redis": {"url": plain_url, "password_file": str(password_file)},
            },
            "postgres": {
                # A role that does not exist: the server refuses it (trust auth checks no password).
                "dsn": f"postgresql://qe_nobody:{POSTGRES_SECRET}@127.0.0.1:5432/postgres",
                "connect_timeout": 1,
                "collectors": [COLLECTOR],
            },
        },
    }

    def settled(series: dict) -> bool:
        return (
            _up(series, "redis") == 1
            and _errors(series, "events:") > 0
            and _errors(series, "postgres:") > 0
        )

    for where, text in serve_and_collect(tmp_path, config, settled):
        assert_no_secret(text, where)


def test_serve_with_backends_unreachable(tmp_path, web_config_file):
    password_file = tmp_path / "redis-password"
    password_file.write_text(REDIS_FILE_SECRET)
    dead = free_port()
    config = {
        "web_config_file": str(web_config_file),
        "presets": ["orchestrata"],
        "sources": {
            "events": {
                "streams": ["qe:events"],
                "redis": {
                    "url": f"redis://127.0.0.1:{dead}/0",
                    "password_file": str(password_file),
                },
            },
            "postgres": {
                "dsn": f"host=127.0.0.1 port={dead} user=qe password={POSTGRES_SECRET} dbname=qe",
                "connect_timeout": 1,
                "collectors": [COLLECTOR],
            },
        },
    }
    url = f"redis://user:{REDIS_URL_SECRET}@127.0.0.1:{dead}/0?password={REDIS_URL_SECRET}"

    def settled(series: dict) -> bool:
        return all(_errors(series, prefix) > 0 for prefix in ("redis", "events:", "postgres:"))

    outputs = serve_and_collect(
        tmp_path,
        config,
        settled,
        env={"QUEUE_EXPORTER_REDIS_URL": url},
        extra_args=("--log-format", "json"),
    )
    for where, text in outputs:
        assert_no_secret(text, where)


def test_serve_with_a_dsn_file_libpq_cannot_parse(tmp_path, web_config_file):
    # libpq quotes the whole URI when it cannot parse it: read at connect time from a file,
    # it is never validated beforehand, so the log lines themselves must mask it.
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(f"postgresql://qe:{POSTGRES_SECRET}@[127.0.0.1/qe")
    config = {
        "web_config_file": str(web_config_file),
        "sources": {
            "postgres": {"dsn_file": str(dsn_file), "connect_timeout": 1, "collectors": [COLLECTOR]}
        },
    }
    outputs = serve_and_collect(tmp_path, config, lambda s: _errors(s, "postgres:") > 0)
    for where, text in outputs:
        assert_no_secret(text, where)
    stderr = dict(outputs)["stderr"]
    assert "postgresql://qe:****@[127.0.0.1/qe" in stderr  # the rest of the message stays


@pytest.mark.fast
def test_redact_masks_passwords_in_urls_and_keyword_strings():
    from exporter.core.logs import redact

    assert redact('in URI: "postgresql://u:p4ss@[h/db"') == 'in URI: "postgresql://u:****@[h/db"'
    assert redact("host=h password='a b' user=x") == "host=h password=**** user=x"
    assert redact("redis://:p@h/0?password=p&db=1") == "redis://:****@h/0?password=****&db=1"
    assert redact("connecting to 127.0.0.1:6379 failed") == "connecting to 127.0.0.1:6379 failed"


@pytest.mark.fast
def test_check_config_masks_every_secret(tmp_path, web_config_file):
    password_file = tmp_path / "redis-password"
    password_file.write_text(REDIS_FILE_SECRET)
    config = {
        "web_config_file": str(web_config_file),
        "presets": ["orchestrata"],
        "sources": {
            "redis": {
                "url": f"redis://user:{REDIS_URL_SECRET}@127.0.0.1:6379/0",
                "password_file": str(password_file),
            },
            "events": {
                "streams": ["qe:events"],
                "redis": {
                    "url": f"redis://127.0.0.1:6379/0?password={REDIS_URL_SECRET}",
                    "password": REDIS_FILE_SECRET,
                },
            },
            "postgres": {
                "dsn": f"postgresql://u:{POSTGRES_SECRET}@h/db?password={POSTGRES_SECRET}",
                "password": POSTGRES_SECRET,
                "collectors": [COLLECTOR],
            },
        },
    }
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["check-config", str(path), "--show-config"])
    assert result.exit_code == 0, result.output
    assert_no_secret(result.output, "check-config output")
    assert "user:****@127.0.0.1:6379" in result.output
    assert "password=****" in result.output


BAD_CONFIGS = [
    {"sources": {"redis": {"url": f"http://u:{REDIS_URL_SECRET}@h/0"}}},
    {"sources": {"redis": {"url": f"redis://u:{REDIS_URL_SECRET}@h:port/0"}}},
    {"sources": {"redis": {"url": f"redis://u:{REDIS_URL_SECRET}@[::1/0"}}},
    {"sources": {"redis": {"password": [REDIS_FILE_SECRET]}}},
    {"sources": {"redis": {"pasword": REDIS_FILE_SECRET}}},
    {"sources": {"redis": {"url": {"nested": REDIS_URL_SECRET}}}},
    {"sources": {"postgres": {"dsn": f"host=h password={POSTGRES_SECRET} bogus=1"}}},
    {"sources": {"postgres": {"dsn": f"user=u password='{POSTGRES_SECRET}"}}},
    {"sources": {"postgres": {"password": POSTGRES_SECRET, "password_file": "/x"}}},
    {"sources": {"postgres": {"password": 12345, "dsn": f"password={POSTGRES_SECRET}", "port": 0}}},
    {"sources": {"events": {"redis": {"url": f"redis://:{REDIS_URL_SECRET}@h/0", "x": 1}}}},
    {"listen_address": f"{POSTGRES_SECRET}", "sources": {"redis": {"url": "redis://h/0"}}},
]


@pytest.mark.parametrize("raw", BAD_CONFIGS)
@pytest.mark.fast
def test_errors_of_bad_configs_quote_no_secret(tmp_path, raw):
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["check-config", str(path)])
    text = result.output
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(*result.exc_info))
    if raw.get("listen_address"):  # not a secret field: quoting it is fine, but it must fail
        assert result.exit_code == 1
        return
    assert result.exit_code == 1, text
    assert text.startswith("error: invalid configuration"), text
    assert_no_secret(text, "the error")


@pytest.mark.fast
def test_yaml_errors_quote_no_line(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(f"sources:\n  redis:\n    url: redis://:{REDIS_URL_SECRET}@h/0: [\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert "not valid YAML" in result.output
    assert_no_secret(result.output, "the YAML error")


# Every form a PostgreSQL secret can be written in, each read where libpq quotes what it cannot
# parse: a URI with a bad %-escape (libpq quotes the password), a key=value DSN whose password
# has a space and no quotes (libpq quotes its second word), one with quotes and escapes, and a
# password file.
PLANTED_FORMS = {
    "uri_bad_escape": (
        {"dsn_file": f"postgresql://qe:Pbad%zz-{MARKER}-x@127.0.0.1:5432/postgres"},
        "invalid percent-encoded token",
    ),
    "keyword_space": (
        {"dsn_file": f"host=127.0.0.1 user=qe password=Pkw {MARKER}-tail dbname=postgres"},
        "in connection info string",
    ),
    "keyword_quoted": (
        {"dsn": f"host=127.0.0.1 user=qe_nobody password='Pq {MARKER} \\'x' dbname=postgres"},
        "qe_nobody",
    ),
    "password_file": ({"password_file": f"Ppf-{MARKER}-planted"}, "qe_nobody"),
}


@pytest.mark.parametrize("form", sorted(PLANTED_FORMS))
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_form_of_a_planted_secret_reaches_any_output(
    tmp_path, web_config_file, form, log_format
):
    settings, still_said = PLANTED_FORMS[form]
    postgres: dict[str, Any] = {"connect_timeout": 1, "collectors": [COLLECTOR]}
    for name, value in settings.items():
        if name.endswith("_file"):
            path = tmp_path / name
            path.write_text(value + "\n")
            value = str(path)
        postgres[name] = value
    if "password_file" in settings:
        postgres.update(host="127.0.0.1", user="qe_nobody", dbname="postgres")
    password_file = tmp_path / "redis-password"
    password_file.write_text(f"Rfile-{MARKER}-x\n")  # the wrong one: refused
    config = {
        "web_config_file": str(web_config_file),
        "sources": {
            "postgres": postgres,
            "events": {
                "streams": ["qe:events"],
                "redis": {
                    "url": f"redis://127.0.0.1:{free_port()}/0",
                    "password_file": str(password_file),
                },
            },
        },
    }
    outputs = serve_and_collect(
        tmp_path,
        config,
        lambda series: _errors(series, "postgres:") > 0,
        extra_args=("--log-format", log_format),
    )
    for where, text in outputs:
        assert_no_secret(text, where)
    assert still_said in dict(outputs)["stderr"]  # the failure itself is still named


@pytest.mark.fast
def test_registered_secrets_leave_tracebacks_and_json_lines():
    from exporter.core.logs import JsonFormatter, RedactingFormatter, register_secret

    secret = f'Pj"son\\{MARKER}'
    register_secret(secret)
    try:
        raise RuntimeError(f"the driver says: {secret}")
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, "f", 1, "failed: %s", (secret,), sys.exc_info()
        )
    for inner in (JsonFormatter(), logging.Formatter("%(message)s")):
        line = RedactingFormatter(inner).format(record)
        assert "Traceback" in line or '"exc"' in line
        assert_no_secret(line, type(inner).__name__)


@pytest.mark.fast
def test_an_uncaught_exception_in_a_thread_is_logged_scrubbed(capsys, monkeypatch):
    from exporter.core.logs import configure, register_secret

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # configure() replaces them
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    secret = f"Pthread-{MARKER}-x"
    register_secret(secret)
    configure("info", "text")

    def crash() -> None:
        raise RuntimeError(f"connect failed: {secret}")

    thread = threading.Thread(target=crash, name="doomed")
    thread.start()
    thread.join()
    stderr = capsys.readouterr().err
    assert "uncaught exception in thread doomed" in stderr
    assert "RuntimeError: connect failed: ****" in stderr
    assert_no_secret(stderr, "stderr")
