"""The web config file (exporter-toolkit format): TLS, client certificates, basic auth,
headers, rate limit, reloading, the start-up warning, and its errors (fuzzed)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import socket
import ssl
import tempfile
from email.message import Message
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.commands.cli import main
from exporter.http import web_config
from exporter.http.access import WebConfigError, parse_basic_auth
from exporter.http.server import MetricsServer
from exporter.http.web_config import parse
from exporter.output.exposition import Rendered
from exporter.output.health import HealthBoard
from tests.conftest import wait_for
from tests.tls_certs import Pki, make_pki

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _render_nothing(openmetrics: bool) -> Rendered:
    return Rendered(b"# EOF\n" if openmetrics else b"")


@pytest.fixture
def serve(tmp_path: Path):
    """Start a MetricsServer with a web config document; stopped after the test."""
    servers: list[MetricsServer] = []

    def start(document: dict[str, Any] | None, host: str = "127.0.0.1") -> MetricsServer:
        path = None
        if document is not None:
            path = tmp_path / "web.yml"
            path.write_text(yaml.safe_dump(document))
        health = HealthBoard()
        health.succeeded("redis", 0.01)
        server = MetricsServer(host, 0, _render_nothing, health, path)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get(
    server: MetricsServer,
    path: str = "/metrics",
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Message, bytes]:
    connection: http.client.HTTPConnection
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    else:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, timeout=10, context=context
        )
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()  # names: any case
    finally:
        connection.close()


def client_context(pki: Pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.path("ca.crt"))
    if cert is not None:
        context.load_cert_chain(pki.path(f"{cert}.crt"), pki.path(f"{cert}.key"))
    return context


# -- basic auth -------------------------------------------------------------------------------


def test_basic_auth_guards_metrics_and_answers_401_with_a_challenge(serve):
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    for headers in (None, _auth("prometheus", "wrong"), _auth("nobody", PASSWORD)):
        status, response_headers, _ = get(server, "/metrics", headers)
        assert status == 401
        assert response_headers["WWW-Authenticate"].startswith("Basic realm=")
    assert get(server, "/metrics", {"Authorization": "Basic !!!not-base64"})[0] == 401
    assert get(server, "/metrics", {"Authorization": "Bearer x"})[0] == 401
    assert get(server, "/", None)[0] == 401
    assert get(server, "/nope", None)[0] == 401  # no path probing without credentials
    assert get(server, "/metrics", _auth("prometheus", PASSWORD))[0] == 200
    assert get(server, "/nope", _auth("prometheus", PASSWORD))[0] == 404  # past the guard


def test_probes_need_no_credentials_but_readiness_details_do(serve):
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    assert get(server, "/healthz")[0] == 200
    status, _, body = get(server, "/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True})
    status, _, body = get(server, "/readyz", _auth("prometheus", PASSWORD))
    assert json.loads(body)["sources"] == {"redis": {"up": True, "error": None}}


def test_auth_excluded_paths(serve):
    server = serve({"basic_auth_users": {"prometheus": HASH}, "auth_excluded_paths": ["/metrics"]})
    assert get(server, "/metrics")[0] == 200
    assert get(server, "/")[0] == 401


def test_a_verified_password_is_remembered(serve, monkeypatch):
    calls: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return bool(real_checkpw(password, hashed))

    monkeypatch.setattr(web_config.bcrypt, "checkpw", counting_checkpw)
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    for _ in range(3):
        assert get(server, "/metrics", _auth("prometheus", PASSWORD))[0] == 200
    assert len(calls) == 1
    for _ in range(2):  # failures are not remembered: each costs a bcrypt check
        assert get(server, "/metrics", _auth("prometheus", "wrong"))[0] == 401
    assert len(calls) == 3


def test_passwords_beyond_bcrypts_72_bytes_are_refused(serve):
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    assert get(server, "/metrics", _auth("prometheus", PASSWORD + "x" * 80))[0] == 401


def test_configured_headers_and_rate_limit(serve):
    server = serve(
        {
            "http_server_config": {
                "headers": {"X-Frame-Options": "deny", "Content-Security-Policy": ""}
            },
            "rate_limit": {"interval": "1h", "burst": 2},
        }
    )
    status, headers, _ = get(server, "/metrics")
    assert status == 200
    assert headers["X-Frame-Options"] == "deny"
    assert "Content-Security-Policy" not in headers  # blank: unset
    assert get(server, "/metrics")[0] == 200
    assert get(server, "/metrics")[0] == 429


# -- TLS --------------------------------------------------------------------------------------


def _tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    config = {"cert_file": str(pki.path("server.crt")), "key_file": str(pki.path("server.key"))}
    return {"tls_server_config": {**config, **extra}}


def test_tls_serves_https_only(serve, pki):
    server = serve(_tls(pki))
    assert server.scheme == "https"
    assert get(server, "/metrics", context=client_context(pki))[0] == 200
    with pytest.raises((http.client.HTTPException, OSError)):
        get(server, "/metrics")  # plain HTTP gets no answer


def test_inline_certificate_and_relative_files(serve, pki, tmp_path):
    inline = {"cert": pki.path("server.crt").read_text(), "key": pki.path("server.key").read_text()}
    server = serve({"tls_server_config": inline})
    assert get(server, "/healthz", context=client_context(pki))[0] == 200
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes(pki.path(name).read_bytes())
    relative = {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}
    (tmp_path / "web.yml").write_text(yaml.safe_dump(relative))
    assert web_config.load(tmp_path / "web.yml").ssl_context is not None


def test_require_and_verify_client_cert(serve, pki):
    server = serve(
        _tls(
            pki,
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=str(pki.path("ca.crt")),
        )
    )
    assert get(server, "/metrics", context=client_context(pki, "client"))[0] == 200
    for refused in (None, "rogue-client"):
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            get(server, "/metrics", context=client_context(pki, refused))


def test_client_allowed_sans(serve, pki):
    server = serve(
        _tls(
            pki,
            client_auth_type="RequireAndVerifyClientCert",
            client_ca_file=str(pki.path("ca.crt")),
            client_allowed_sans=["scraper", "::1"],
        )
    )
    assert get(server, "/metrics", context=client_context(pki, "client"))[0] == 200
    with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
        get(server, "/metrics", context=client_context(pki, "other-client"))


def test_verify_client_cert_if_given(serve, pki):
    server = serve(
        _tls(
            pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.path("ca.crt"))
        )
    )
    assert get(server, "/metrics", context=client_context(pki))[0] == 200
    assert get(server, "/metrics", context=client_context(pki, "client"))[0] == 200
    with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
        get(server, "/metrics", context=client_context(pki, "rogue-client"))


def test_tls_with_basic_auth_as_the_toolkit_sample(serve, pki):
    server = serve({**_tls(pki, min_version="TLS13"), "basic_auth_users": {"alice": HASH}})
    context = client_context(pki)
    assert get(server, "/metrics", context=context)[0] == 401
    assert get(server, "/metrics", _auth("alice", PASSWORD), context=context)[0] == 200
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, OSError)):
        get(server, "/metrics", context=old)


# -- reloading --------------------------------------------------------------------------------


def test_a_changed_file_applies_without_restart(serve, tmp_path, monkeypatch):
    monkeypatch.setattr(web_config.WebConfigWatcher, "CHECK_SECONDS", 0.0)
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    assert get(server, "/metrics", _auth("prometheus", PASSWORD))[0] == 200
    new_hash = bcrypt.hashpw(b"rotated", bcrypt.gensalt(4)).decode()
    (tmp_path / "web.yml").write_text(
        yaml.safe_dump({"basic_auth_users": {"prometheus": new_hash}})
    )
    wait_for(lambda: get(server, "/metrics", _auth("prometheus", PASSWORD))[0] == 401)
    assert get(server, "/metrics", _auth("prometheus", "rotated"))[0] == 200


def test_a_rotated_certificate_serves_new_connections(serve, pki, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(web_config.WebConfigWatcher, "CHECK_SECONDS", 0.0)
    for name in ("crt", "key"):
        (tmp_path / f"server.{name}").write_bytes(pki.path(f"server.{name}").read_bytes())
    server = serve({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}})

    def serial() -> str:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            return str(tls.getpeercert()["serialNumber"])

    first = serial()
    # cert-manager writes one file, then the other: in between they do not match.
    (tmp_path / "server.crt").write_bytes(pki.path("server-rotated.crt").read_bytes())
    wait_for(lambda: serial() and "still serving the last good one" in caplog.text)
    assert serial() == first
    (tmp_path / "server.key").write_bytes(pki.path("server-rotated.key").read_bytes())
    wait_for(lambda: serial() != first)
    assert get(server, "/metrics", context=client_context(pki))[0] == 200


UNUSABLE_CHANGES = [
    ("", "the file is empty"),
    ("basic_auth_users: [", "not valid YAML"),
    ("\x00\xff garbage: {", "not valid YAML"),
    ("- a list\n", "top level must be a mapping"),
    pytest.param(  # the 32nd bracket: the 32nd level below the file's mapping
        "basic_auth_users: " + "[" * 1000 + "]" * 1000,
        "line 1 column 50: nested deeper than 32 levels",
        id="nested-1000-deep",
    ),
    ("basic_auth_users: {}\n", "turning basic auth off needs a restart"),
    ("http_server_config: {headers: {X-Frame-Options: deny}}\n", "turning basic auth off"),
    ("basic_auth_users: {prometheus: plaintext}\n", "not a bcrypt hash"),
]


@pytest.mark.parametrize(("text", "logged"), UNUSABLE_CHANGES)
def test_a_change_that_cannot_apply_keeps_the_last_good_config(
    serve, tmp_path, monkeypatch, caplog, text, logged
):
    monkeypatch.setattr(web_config.WebConfigWatcher, "CHECK_SECONDS", 0.0)
    server = serve({"basic_auth_users": {"prometheus": HASH}})
    (tmp_path / "web.yml").write_text(text)
    wait_for(lambda: get(server, "/healthz") and logged in caplog.text)  # a request reloads
    assert "still serving the last good one" in caplog.text
    assert get(server, "/metrics")[0] == 401  # never opened by a broken or weaker file
    assert get(server, "/metrics", _auth("prometheus", PASSWORD))[0] == 200
    assert get(server, "/healthz")[0] == 200
    # Fixed again: applied again.
    rotated = bcrypt.hashpw(b"rotated", bcrypt.gensalt(4)).decode()
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"alice": rotated}}))
    wait_for(lambda: get(server, "/metrics", _auth("alice", "rotated"))[0] == 200)


def test_tls_stays_on_when_the_file_would_turn_it_off(serve, pki, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(web_config.WebConfigWatcher, "CHECK_SECONDS", 0.0)
    verified = _tls(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.path("ca.crt"))
    )
    server = serve(verified)
    context = client_context(pki, "client")
    assert get(server, "/metrics", context=context)[0] == 200
    for weaker, logged in (
        ({"basic_auth_users": {"prometheus": HASH}}, "turning TLS on or off"),
        (_tls(pki), "no longer requiring verified client certificates"),
    ):
        caplog.clear()
        (tmp_path / "web.yml").write_text(yaml.safe_dump(weaker))
        wait_for(
            lambda logged=logged: get(server, "/metrics", context=context) and logged in caplog.text
        )
        assert get(server, "/metrics", context=context)[0] == 200
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            get(server, "/metrics", context=client_context(pki))  # still no certificate, no entry


# -- start-up ---------------------------------------------------------------------------------


@pytest.mark.fast
def test_warns_when_metrics_are_open_beyond_localhost(serve, caplog):
    caplog.set_level(logging.WARNING, logger="exporter.http.server")
    serve(None, host="127.0.0.1")
    serve({"basic_auth_users": {"prometheus": HASH}}, host="0.0.0.0")
    assert "without authentication" not in caplog.text
    serve(None, host="0.0.0.0")
    assert "/metrics is served on 0.0.0.0 without authentication" in caplog.text


def test_app_serves_with_the_configured_web_config(run_exporter, redis_url, tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": HASH}}))
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"], web_config=str(path))
    assert get(app.server, "/metrics")[0] == 401
    assert get(app.server, "/metrics", _auth("prometheus", PASSWORD))[0] == 200


@pytest.mark.fast
def test_check_config_and_serve_refuse_a_bad_web_config(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": "s3cret-plaintext"}}))
    config = tmp_path / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "web_config_file": str(web),
                "listen_address": "127.0.0.1:0",
                "presets": ["orchestrata"],  # something to serve: serve refuses to start without
            }
        )
    )
    runner = CliRunner()
    for args in (["check-config", str(config)], ["serve", "--config", str(config)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 1, result.output
        assert f"invalid web config {web}" in result.output
        assert "basic_auth_users.prometheus" in result.output
        assert "s3cret-plaintext" not in result.output
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": HASH}}))
    assert runner.invoke(main, ["check-config", str(config)]).exit_code == 0


# -- errors -----------------------------------------------------------------------------------

BAD_CONFIGS = [
    ({"tls_server_config": {"cert_file": "a.crt"}}, "missing one of key or key_file"),
    ({"tls_server_config": {"key": "SECRET-KEY-TEXT"}}, "missing one of cert or cert_file"),
    (
        {"tls_server_config": {"cert": "x", "cert_file": "a", "key_file": "b"}},
        "set cert or cert_file, not both",
    ),
    (
        {"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}},
        "client CA is set but client_auth_type is NoClientCert",
    ),
    (
        {
            "tls_server_config": {
                "cert_file": "a",
                "key_file": "b",
                "client_auth_type": "RequireAndVerifyClientCert",
            }
        },
        "needs client_ca_file",
    ),
    (
        {"tls_server_config": {"cert_file": "a", "key_file": "b", "client_allowed_sans": ["x"]}},
        "client_allowed_sans needs client_auth_type",
    ),
    (
        {"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Any"}},
        "tls_server_config.client_auth_type",
    ),
    (
        {
            "tls_server_config": {
                "cert_file": "a",
                "key_file": "b",
                "min_version": "TLS13",
                "max_version": "TLS12",
            }
        },
        "min_version TLS13 is above max_version TLS12",
    ),
    (
        {"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": ["RC4"]}},
        "unknown cipher suite",
    ),
    (
        {"basic_auth_users": {"alice": "SECRET-PLAINTEXT"}},
        "basic_auth_users.alice: not a bcrypt hash",
    ),
    ({"http_server_config": {"headers": {"Server": "x"}}}, "'Server' can not be configured"),
    (
        {"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
        "X-Frame-Options must be one of",
    ),
    (
        {"http_server_config": {"headers": {"Strict-Transport-Security": "a\r\nSet-Cookie: x"}}},
        "only printable ASCII",
    ),
    ({"rate_limit": {"interval": "soon", "burst": 1}}, "rate_limit.interval"),
    ({"rate_limit": {"interval": "1s"}}, "burst must be at least 1"),
    ({"tls_config": {}}, "tls_config: Extra inputs are not permitted"),
    ({"auth_excluded_paths": ["metrics"]}, "must start with /"),
]


@pytest.mark.parametrize(("document", "expected"), BAD_CONFIGS)
@pytest.mark.fast
def test_errors_name_the_file_and_setting_and_quote_no_secret(tmp_path, document, expected):
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(WebConfigError) as caught:
        web_config.load(path)
    message = str(caught.value)
    assert str(path) in message
    assert expected in message
    assert "SECRET" not in message


@pytest.mark.fast
def test_file_level_errors(tmp_path, pki):
    with pytest.raises(WebConfigError, match=r"cannot read web config .*: No such file"):
        web_config.load(tmp_path / "absent.yml")
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: {alice: [\n")
    with pytest.raises(WebConfigError, match="line 2 column 1: not valid YAML"):
        web_config.load(path)
    path.write_text("- a list\n")
    with pytest.raises(WebConfigError, match="top level must be a mapping"):
        web_config.load(path)
    path.write_text(
        yaml.safe_dump({"tls_server_config": {"cert": "not a pem", "key": "SECRET-NOT-A-KEY"}})
    )
    with pytest.raises(WebConfigError, match="cannot load the certificate and key") as caught:
        web_config.load(path)
    assert "SECRET" not in str(caught.value)
    path.write_text(yaml.safe_dump(_tls(pki, key_file=str(pki.path("client.key")))))
    with pytest.raises(WebConfigError, match="tls_server_config: cannot load the certificate"):
        web_config.load(path)


@pytest.mark.fast
def test_the_toolkit_sample_and_an_empty_file_load(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("")
    assert web_config.load(path).ssl_context is None
    path.write_text(
        "basic_auth_users:\n"
        "  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n"
        "  bob: $2y$10$hLqFl9jSjoAAy95Z/zw8Ye8wkdMBM8c5Bn1ptYqP/AXyV0.oy0S8m\n"
        "rate_limit:\n  interval: 1s\n  burst: 20\n"
        "http_server_config:\n  http2: false\n"
    )
    loaded = web_config.load(path)
    assert sorted(loaded.config.basic_auth_users) == ["alice", "bob"]
    assert loaded.config.rate_limit.interval == 1.0


# -- fuzzing ----------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        ["TLS12", "TLS13", "RequireAndVerifyClientCert", "1s", "0", HASH, "/metrics", "nosniff"]
    ),
)
_KEYS = [
    "tls_server_config",
    "http_server_config",
    "basic_auth_users",
    "auth_excluded_paths",
    "rate_limit",
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
    "http2",
    "headers",
    "X-Frame-Options",
    "interval",
    "burst",
    "alice",
]
_documents = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(_KEYS), st.text(max_size=8)), children, max_size=5
        ),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_documents)
def test_fuzzed_documents_raise_only_web_config_errors(document):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, "web.yml")
        try:
            path.write_text(yaml.safe_dump(document))
        except (yaml.YAMLError, UnicodeEncodeError):
            return  # hypothesis made a value YAML cannot write (a lone surrogate)
        with contextlib.suppress(WebConfigError):
            web_config.load(path)


@settings(max_examples=400, deadline=None)
@given(text=st.text(max_size=200))
@pytest.mark.fast
def test_fuzzed_text_raises_only_web_config_errors(text):
    with contextlib.suppress(WebConfigError):
        parse(text, Path("web.yml"))


@settings(max_examples=300, deadline=None)
@given(
    header=st.one_of(
        st.none(),
        st.text(max_size=60),
        st.binary(max_size=40).map(lambda raw: "Basic " + base64.b64encode(raw).decode()),
    )
)
@pytest.mark.fast
def test_fuzzed_authorization_headers_never_raise(header):
    parsed = parse_basic_auth(header)
    assert parsed is None or isinstance(parsed[1], bytes)
