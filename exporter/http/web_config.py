"""The web config file (--web-config): TLS, client certificates, basic auth, response headers.

The file has the exporter-toolkit format that node_exporter, redis_exporter and the rest read
(`web.config.file`), so an operator's existing file works here unchanged. What Python's ssl
module cannot express is mapped to the nearest stricter behaviour, or refused with a clear
error; docs/security.md lists each case.

Like the toolkit, the file is watched: a changed file (or changed certificate, key or CA file)
is loaded again for the next connection, so rotated certificates and passwords take effect
without a restart. A change that does not load, or would turn protection off, is refused with
an error in the log and the last good config stays in force (as in Prometheus).

Every error is a WebConfigError naming the file and the setting; none quotes a secret.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Annotated, Any, Literal

import bcrypt
import yaml
from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from exporter.core import nesting
from exporter.core.logs import register_model_secrets
from exporter.core.models import StrictModel
from exporter.http.access import VERIFYING_CLIENT_AUTH, WebConfigError

log = logging.getLogger(__name__)


ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",  # the toolkit's old name for RequireAnyClientCert
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
CurveName = Literal["CurveP256", "CurveP384", "CurveP521", "X25519"]

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1"}
CURVES["X25519"] = "X25519"

# Go names cipher suites by their IANA names; OpenSSL has names of its own. TLS 1.3 suites
# are accepted and, as in Go, not configurable (None).
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}

# The toolkit allows these headers only, with these values where it restricts them.
ALLOWED_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")  # no CR/LF: a value can never add a header
_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _bcrypt_hash(hashed: SecretStr) -> SecretStr:
    if not _BCRYPT_HASH.match(hashed.get_secret_value()):
        raise ValueError("not a bcrypt hash (make one with: htpasswd -nBC 10 '' | tr -d ':\\n')")
    return hashed


BcryptHash = Annotated[SecretStr, AfterValidator(_bcrypt_hash)]


class TlsServerConfig(StrictModel):
    cert: str | None = Field(None, description="inline PEM certificate (instead of cert_file)")
    key: SecretStr | None = Field(None, description="inline PEM key (instead of key_file)")
    client_ca: str | None = Field(None, description="inline PEM CA for client certificates")
    cert_file: Path | None = None
    key_file: Path | None = None
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: list[str] | None = None
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    cipher_suites: list[str] = Field(default_factory=list)
    prefer_server_cipher_suites: bool = True
    curve_preferences: list[CurveName] = Field(default_factory=list)

    @property
    def enabled(self) -> bool:
        """As in the toolkit: TLS is on as soon as any certificate setting is given."""
        given = (self.cert, self.key, self.client_ca, self.cert_file, self.key_file)
        has_ca = self.client_ca_file is not None
        return (
            any(v is not None for v in given)
            or has_ca
            or "client_auth_type" in self.model_fields_set
        )

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in CIPHER_SUITES]
        if unknown:
            raise ValueError(f"unknown cipher suite(s) {unknown}; known: {sorted(CIPHER_SUITES)}")
        return names

    @model_validator(mode="after")
    def _consistent(self) -> TlsServerConfig:
        if not self.enabled:
            return self
        problems = []
        for inline, file in (("cert", "cert_file"), ("key", "key_file")):
            given = [getattr(self, inline) is not None, getattr(self, file) is not None]
            if all(given):
                problems.append(f"set {inline} or {file}, not both")
            elif not any(given):
                problems.append(f"missing one of {inline} or {file}")
        has_ca = self.client_ca is not None or self.client_ca_file is not None
        if self.client_ca is not None and self.client_ca_file is not None:
            problems.append("set client_ca or client_ca_file, not both")
        if has_ca and self.client_auth_type == "NoClientCert":
            problems.append("a client CA is set but client_auth_type is NoClientCert")
        needs_ca = self.client_auth_type in (*VERIFYING_CLIENT_AUTH, "VerifyClientCertIfGiven")
        if needs_ca and not has_ca:
            # Go would fall back to the system roots: any publicly trusted certificate would
            # do. Refused here: a client CA of one's own is the point of client certificates.
            problems.append(f"client_auth_type {self.client_auth_type} needs client_ca_file")
        if (
            self.client_allowed_sans is not None
            and self.client_auth_type not in VERIFYING_CLIENT_AUTH
        ):
            problems.append(
                "client_allowed_sans needs client_auth_type RequireAndVerifyClientCert "
                "or RequireAnyClientCert"
            )
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            problems.append(
                f"min_version {self.min_version} is above max_version {self.max_version}"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def files(self) -> list[Path]:
        return [p for p in (self.cert_file, self.key_file, self.client_ca_file) if p is not None]


class HttpServerConfig(StrictModel):
    http2: bool = Field(True, description="accepted for compatibility: this server speaks HTTP/1.1")
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in ALLOWED_HEADERS:
                raise ValueError(f"HTTP header {name!r} can not be configured")
            allowed = ALLOWED_HEADERS[name]
            if allowed and value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}")
            if not _HEADER_VALUE.match(value):
                raise ValueError(f"{name}: only printable ASCII is allowed in a header value")
        return headers


class RateLimitConfig(StrictModel):
    interval: float = Field(0.0, ge=0, description="seconds between requests (Go duration: 1s)")
    burst: int = Field(0, ge=0)

    @field_validator("interval", mode="before")
    @classmethod
    def _go_duration(cls, value: Any) -> Any:
        return parse_go_duration(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _burst_with_interval(self) -> RateLimitConfig:
        if self.interval > 0 and self.burst < 1:
            raise ValueError("burst must be at least 1 when interval is set")
        return self


class WebConfig(StrictModel):
    tls_server_config: TlsServerConfig = Field(default_factory=TlsServerConfig)
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, BcryptHash] = Field(
        default_factory=dict, description="user: bcrypt hash (htpasswd -nBC 10 '' | tr -d ':\\n')"
    )
    auth_excluded_paths: list[str] = Field(default_factory=list)
    rate_limit: RateLimitConfig = Field(default_factory=RateLimitConfig)

    @field_validator("auth_excluded_paths")
    @classmethod
    def _absolute_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not a path (it must start with /)")
        return paths


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string ("1s", "1m30s", "250ms", "0")."""
    if text.strip() == "0":
        return 0.0
    if not text or _GO_DURATION.sub("", text) != "":
        raise ValueError("expected a duration such as 1s, 500ms or 1m30s")
    return sum(float(n) * _DURATION_UNITS[unit] for n, unit in _GO_DURATION.findall(text))


# -- loading ----------------------------------------------------------------------------------


class LoadedWebConfig:
    """A validated file and what it builds: the TLS context and the files it depends on."""

    def __init__(self, path: Path, config: WebConfig) -> None:
        self.path = path
        self.config = config
        register_model_secrets(config)  # hashes and an inline key: never in a log line
        self.ssl_context = build_ssl_context(config.tls_server_config, path)

    @property
    def tls(self) -> TlsServerConfig:
        return self.config.tls_server_config

    def watched_files(self) -> list[Path]:
        return [self.path, *self.tls.files()]

    def authenticates(self) -> bool:
        """Whether /metrics asks who reads it: a password or a verified client certificate."""
        tls = self.tls
        verifies = tls.enabled and tls.client_auth_type in VERIFYING_CLIENT_AUTH
        return bool(self.config.basic_auth_users) or verifies

    def describe(self) -> str:
        tls = self.tls
        parts = [f"TLS on ({tls.client_auth_type})" if tls.enabled else "TLS off"]
        parts.append(f"basic auth for {len(self.config.basic_auth_users)} user(s)")
        return f"web config {self.path}: " + ", ".join(parts)


def load(path: Path) -> LoadedWebConfig:
    """Read, validate and build; raise WebConfigError naming the file and the setting."""
    return LoadedWebConfig(path, parse(_read_text(path), path))


def parse(text: str, path: Path) -> WebConfig:
    """Validate the file's text; relative file names are taken from the file's directory."""
    try:
        document = nesting.load_yaml(text)
    except nesting.TooDeep as error:
        raise WebConfigError(f"{path}: {error.where}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise WebConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise WebConfigError(f"{path}: the top level must be a mapping")
    try:
        config = WebConfig.model_validate(document)
    except ValidationError as error:
        lines = [
            f"  {_error_path(item['loc'])}: {_message(item['msg'])}" for item in error.errors()
        ]
        raise WebConfigError(f"invalid web config {path}:\n" + "\n".join(lines)) from None
    return _relative_to(config, path.parent)


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, ValueError) as error:  # ValueError: a NUL in the name
        reason = getattr(error, "strerror", None) or "unreadable"
        raise WebConfigError(f"cannot read web config {path}: {reason}") from None


def _relative_to(config: WebConfig, base: Path) -> WebConfig:
    tls = config.tls_server_config
    moved = {
        name: base / value
        for name in ("cert_file", "key_file", "client_ca_file")
        if (value := getattr(tls, name)) is not None and not value.is_absolute()
    }
    if not moved:
        return config
    return config.model_copy(update={"tls_server_config": tls.model_copy(update=moved)})


def _error_path(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _message(message: str) -> str:
    return message.removeprefix("Value error, ")


def build_ssl_context(tls: TlsServerConfig, path: Path) -> ssl.SSLContext | None:
    """The server's TLS context, or None when the file configures no TLS."""
    if not tls.enabled:
        return None
    try:
        return _ssl_context(tls)
    except WebConfigError as error:
        raise WebConfigError(f"{path}: tls_server_config: {error}") from None


def _ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[tls.min_version]
        context.maximum_version = TLS_VERSIONS[tls.max_version]
    except ValueError as error:
        raise WebConfigError(f"TLS versions not supported here: {error}") from None
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    ciphers = [name for s in tls.cipher_suites if (name := CIPHER_SUITES[s]) is not None]
    if ciphers:
        _apply(context.set_ciphers, ":".join(ciphers), "cipher_suites")
    if tls.curve_preferences:
        # OpenSSL through Python takes one curve, not a preference list: the first one given.
        _apply(context.set_ecdh_curve, CURVES[tls.curve_preferences[0]], "curve_preferences")
    _load_certificate(context, tls)
    _load_client_ca(context, tls)
    return context


def _apply(setter: Any, value: str, setting: str) -> None:
    try:
        setter(value)
    except (ssl.SSLError, ValueError):
        raise WebConfigError(f"{setting}: not supported by this OpenSSL") from None


def _load_certificate(context: ssl.SSLContext, tls: TlsServerConfig) -> None:
    try:
        if tls.cert_file is not None and tls.key_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
            return
        with tempfile.TemporaryDirectory(prefix="queue-exporter-tls-") as directory:
            # ssl loads certificates from files only: inline PEM goes through a private
            # directory (0700) that is removed right after loading.
            cert = _inline_or_file(tls.cert, tls.cert_file, Path(directory, "cert.pem"))
            key_text = tls.key.get_secret_value() if tls.key is not None else None
            key = _inline_or_file(key_text, tls.key_file, Path(directory, "key.pem"))
            context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or "invalid"
        raise WebConfigError(f"cannot load the certificate and key: {reason}") from None


def _inline_or_file(inline: str | None, file: Path | None, scratch: Path) -> Path:
    if file is not None:
        return file
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(inline or "")
    return scratch


def _load_client_ca(context: ssl.SSLContext, tls: TlsServerConfig) -> None:
    # RequestClientCert asks for a certificate nobody verifies or reads: Python cannot ask
    # without verifying, and nothing here uses an unverified one, so it is not asked for.
    # RequireAnyClientCert (any certificate, unverified) cannot be expressed either: it is
    # served as RequireAndVerifyClientCert against the client CA, which is stricter.
    modes = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL}
    context.verify_mode = (
        ssl.CERT_REQUIRED
        if tls.client_auth_type in VERIFYING_CLIENT_AUTH
        else modes.get(tls.client_auth_type, ssl.CERT_NONE)
    )
    if tls.client_auth_type in ("NoClientCert", "RequestClientCert"):
        return
    try:
        if tls.client_ca_file is not None:
            context.load_verify_locations(cafile=tls.client_ca_file)
        else:
            context.load_verify_locations(cadata=tls.client_ca or "")
    except (ssl.SSLError, OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or "invalid"
        raise WebConfigError(f"cannot load the client CA: {reason}") from None


def client_san_allowed(tls: TlsServerConfig, peer: dict[str, Any] | None) -> bool:
    """True unless client_allowed_sans is set and the client's certificate has none of them."""
    if tls.client_allowed_sans is None:
        return True
    if not peer:
        return False
    allowed = {_normal_san(value) for value in tls.client_allowed_sans}
    return any(_normal_san(value) in allowed for _, value in peer.get("subjectAltName", ()))


def _normal_san(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))  # Python prints IPv6 SANs uncompressed
    except ValueError:
        return value


# -- basic auth -------------------------------------------------------------------------------

_HASH_COST = re.compile(r"^\$2[abxy]?\$(\d\d)\$")


class BasicAuthenticator:
    """Checks basic auth credentials against bcrypt hashes, in a time that names no user.

    bcrypt costs tens to hundreds of milliseconds per check on purpose, and Prometheus sends
    the same credentials every scrape: a success is remembered for CACHE_SECONDS under an
    HMAC (with a key of this process's own) of user, hash and password, so neither the
    password nor a plain hash of it is held, and a remembered login costs no bcrypt at all.

    A wrong password for a cost-4 user would be refused in 2 ms and one for a cost-12 user in
    240 ms, and an unknown user in yet another time: response times would tell which users
    exist. So an unknown user is checked against a decoy hash at the highest cost configured,
    and every refusal is answered no sooner than `failure_floor` (1.5 times the longest of the
    last RECENT_CHECKS checks at that cost here), whoever the user. Recent checks, not the
    first one alone: a check measured on a quiet host would set a floor that checks exceed
    once the host is busier, and the time of a refusal would name the costly users again.
    """

    CACHE_SECONDS = 60.0
    CACHE_SIZE = 256
    FLOOR_MARGIN = 1.5
    RECENT_CHECKS = 16

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._verified: dict[bytes, float] = {}
        self._lock = threading.Lock()
        self._decoys: dict[int, bytes] = {}  # cost -> a hash of a random password
        # cost -> seconds the last RECENT_CHECKS checks at that cost took (the decoy's making too)
        self._checks: dict[int, deque[float]] = {}

    def remembered(self, users: dict[str, SecretStr], credentials: tuple[str, bytes]) -> bool:
        """True when these credentials were verified within CACHE_SECONDS (no bcrypt)."""
        now = time.monotonic()
        with self._lock:
            return self._verified.get(self._cache_key(users, credentials), 0.0) > now

    def verify(self, users: dict[str, SecretStr], credentials: tuple[str, bytes]) -> str | None:
        """None when the credentials are right, else the reason (blocks for a bcrypt check)."""
        user, password = credentials
        hashed = users.get(user)
        if hashed is None:
            self._timed_check(users, password, self._decoy(users))
            return "unknown_user"
        if not self._timed_check(users, password, hashed.get_secret_value().encode()):
            return "wrong_password"
        now = time.monotonic()
        with self._lock:
            if len(self._verified) >= self.CACHE_SIZE:
                self._verified = {k: t for k, t in self._verified.items() if t > now}
                if len(self._verified) >= self.CACHE_SIZE:
                    self._verified.clear()
            self._verified[self._cache_key(users, credentials)] = now + self.CACHE_SECONDS
        return None

    def failure_floor(self, users: dict[str, SecretStr]) -> float:
        """Seconds a refused check takes at least (blocks to measure bcrypt the first time)."""
        self._decoy(users)
        with self._lock:
            return max(self._checks[_highest_cost(users)]) * self.FLOOR_MARGIN

    def _timed_check(self, users: dict[str, SecretStr], password: bytes, hashed: bytes) -> bool:
        """bcrypt's answer; a check at the highest cost configured is remembered for the floor."""
        started = time.perf_counter()
        matches = _bcrypt_matches(password, hashed)
        cost = _highest_cost(users)
        if _hash_cost(hashed) == cost:
            self._observe(cost, time.perf_counter() - started)
        return matches

    def _observe(self, cost: int, seconds: float) -> None:
        with self._lock:
            self._checks.setdefault(cost, deque(maxlen=self.RECENT_CHECKS)).append(seconds)

    def _decoy(self, users: dict[str, SecretStr]) -> bytes:
        cost = _highest_cost(users)
        with self._lock:
            decoy = self._decoys.get(cost)
        if decoy is None:
            started = time.perf_counter()
            hashed = bcrypt.hashpw(secrets.token_urlsafe(16).encode(), bcrypt.gensalt(cost))
            self._observe(cost, time.perf_counter() - started)  # hashing costs what a check does
            with self._lock:
                decoy = self._decoys.setdefault(cost, hashed)
        return decoy

    def _cache_key(self, users: dict[str, SecretStr], credentials: tuple[str, bytes]) -> bytes:
        user, password = credentials
        hashed = users.get(user)
        hashed_bytes = hashed.get_secret_value().encode() if hashed is not None else b""
        parts = (user.encode(), hashed_bytes, password)
        return hmac.new(self._key, b"\0".join(parts), "sha256").digest()


def _highest_cost(users: dict[str, SecretStr]) -> int:
    return max(
        (_hash_cost(hashed.get_secret_value().encode()) for hashed in users.values()), default=10
    )


def _hash_cost(hashed: bytes) -> int:
    match = _HASH_COST.match(hashed.decode("ascii", "replace"))
    return int(match.group(1)) if match else 10


def _bcrypt_matches(password: bytes, hashed: bytes) -> bool:
    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # a password over bcrypt's 72 bytes, or a hash bcrypt cannot read
        return False


# -- watching the file ------------------------------------------------------------------------


class TokenBucket:
    def __init__(self, interval: float, burst: int) -> None:
        self.interval = interval
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) / self.interval)
            self._last = now
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


class WebConfigWatcher:
    """The current web config, loaded again when its file or a file it names changes.

    As in Prometheus, a change that cannot be applied leaves the last good config in force and
    is logged as an error: a file that cannot be read or parsed (an empty one is taken for a
    write in progress), and a change that takes protection away (basic auth or TLS off, client
    certificates no longer verified), which needs a restart, as turning TLS on does. So
    emptying or corrupting the file never opens /metrics.
    """

    CHECK_SECONDS = 1.0  # at most one stat() round per second, however often scrapes come

    def __init__(self, path: Path) -> None:
        self.path = path
        self.authenticator = BasicAuthenticator()
        self._loaded = load(path)
        self.tls_enabled = self._loaded.ssl_context is not None
        self._stamps = _stamps(self._loaded.watched_files())
        self._next_check = time.monotonic() + self.CHECK_SECONDS
        self._rate_limit = self._loaded.config.rate_limit
        self._limiter = _limiter(self._rate_limit)
        self._lock = threading.Lock()

    def current(self) -> LoadedWebConfig:
        """The config to serve with: the file's, or the last good one while it cannot be used."""
        now = time.monotonic()
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check:
                    self._next_check = now + self.CHECK_SECONDS
                    self._reload_if_changed()
        return self._loaded

    def allow_request(self) -> bool:
        limiter = self._limiter
        return limiter is None or limiter.allow()

    def _reload_if_changed(self) -> None:
        stamps = _stamps(self._loaded.watched_files())
        if stamps == self._stamps:
            return
        self._stamps = stamps  # one error per change, not one per check
        try:
            loaded = self._replacement()
        except WebConfigError as error:
            log.error("web config change not applied, still serving the last good one: %s", error)
            return
        self._loaded = loaded
        self._stamps = _stamps(loaded.watched_files())
        if loaded.config.rate_limit != self._rate_limit:
            self._rate_limit = loaded.config.rate_limit
            self._limiter = _limiter(self._rate_limit)
        log.info("web config reloaded from %s", self.path)

    def _replacement(self) -> LoadedWebConfig:
        text = _read_text(self.path)
        if not text.strip():
            raise WebConfigError(f"{self.path}: the file is empty (a write in progress?)")
        loaded = LoadedWebConfig(self.path, parse(text, self.path))
        weakening = _weakening(self._loaded, loaded)
        if weakening is not None:
            raise WebConfigError(f"{self.path}: {weakening} needs a restart")
        return loaded


def _weakening(old: LoadedWebConfig, new: LoadedWebConfig) -> str | None:
    """What of the old config's protection the new one would turn off (or TLS on), if any."""
    if (old.ssl_context is None) != (new.ssl_context is None):
        return "turning TLS on or off"
    if old.config.basic_auth_users and not new.config.basic_auth_users:
        return "turning basic auth off"
    verifying = VERIFYING_CLIENT_AUTH
    if old.tls.client_auth_type in verifying and new.tls.client_auth_type not in verifying:
        return "no longer requiring verified client certificates"
    return None


def _limiter(config: RateLimitConfig) -> TokenBucket | None:
    return TokenBucket(config.interval, config.burst) if config.interval > 0 else None


def _stamps(paths: list[Path]) -> list[tuple[int, int] | None]:
    stamps: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            info = path.stat()
            stamps.append((info.st_mtime_ns, info.st_size))
        except (OSError, ValueError):
            stamps.append(None)
    return stamps
