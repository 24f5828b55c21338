"""One way to open Redis for every part of the exporter: URL, ACL user, password file, TLS.

Every connection has client-side deadlines (connect and per command) and no retries of its own:
redis-py retries a timed-out command 10 times by default, so one call to a frozen server would
take a minute. A caller that fails retries on its own schedule (the next cycle, the next read).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import redis
from pydantic import Field, SecretStr, field_validator
from redis.backoff import NoBackoff
from redis.retry import Retry

from exporter.logs import mask_connection_string, register_secret
from exporter.models import StrictModel

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class RedisConnectionConfig(StrictModel):
    url: SecretStr = Field(
        SecretStr(DEFAULT_REDIS_URL),
        description="redis://, rediss:// or unix:// URL; a password in it is masked everywhere",
    )
    username: str | None = Field(None, description="ACL user (overrides the URL's)")
    password: SecretStr | None = Field(None, description="password (prefer password_file)")
    password_file: Path | None = Field(None, description="file holding the password")
    tls_ca_file: Path | None = Field(None, description="rediss://: CA bundle to verify the server")
    tls_cert_file: Path | None = Field(None, description="rediss://: client certificate")
    tls_key_file: Path | None = Field(None, description="rediss://: client certificate's key")
    socket_timeout: float = Field(5.0, gt=0, description="seconds a single command may take")
    connect_timeout: float = Field(
        5.0, gt=0, description="seconds opening a connection (TCP, TLS) may take"
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: SecretStr) -> SecretStr:
        parts = urlsplit(url.get_secret_value())
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"URL scheme must be redis, rediss or unix, not {parts.scheme!r}")
        try:
            parts.port  # noqa: B018  # raises for a port that is not a number
        except ValueError:
            raise ValueError("the URL's port is not a number between 0 and 65535") from None
        return url

    def resolved_password(self) -> str | None:
        if self.password_file is not None:
            password = self.password_file.read_text().strip()
            register_secret(password)  # read anew at each connect: a rotated one too
            return password
        return self.password.get_secret_value() if self.password else None

    def masked_url(self) -> str:
        return mask_connection_string(self.url.get_secret_value())

    def connect(self) -> redis.Redis:
        """A client whose replies are bytes: decoding is left to the few values that need it."""
        extra: dict[str, object] = {}
        if self.tls_ca_file:
            extra["ssl_ca_certs"] = str(self.tls_ca_file)
        if self.tls_cert_file:
            extra["ssl_certfile"] = str(self.tls_cert_file)
        if self.tls_key_file:
            extra["ssl_keyfile"] = str(self.tls_key_file)
        password = self.resolved_password()
        if password is not None:
            extra["password"] = password
        if self.username:
            extra["username"] = self.username
        return redis.Redis.from_url(
            self.url.get_secret_value(),
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=self.connect_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=30,
            **extra,
        )


def sever(client: redis.Redis | None) -> None:
    """From another thread: shut down every socket of the client's pool, in use or not.

    A call blocked on a hung server fails at once (a deadline passed, or shutdown); the next
    call opens a new connection."""
    if client is not None:
        client.connection_pool.disconnect(inuse_connections=True)


def redis_error_reason(error: Exception) -> str:
    """A short, bounded label value for a Redis failure."""
    if isinstance(error, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return "auth"
    if isinstance(error, redis.TimeoutError):
        return "timeout"
    if isinstance(error, redis.ConnectionError):
        return "connection"
    if isinstance(error, redis.ResponseError):
        return "response"
    return "other" if isinstance(error, redis.RedisError) else "internal"
