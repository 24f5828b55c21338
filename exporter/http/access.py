"""What serving HTTP needs of the web config without loading it (exporter/http/web_config.py: its
models, bcrypt, ssl contexts, loaded only when a file is given): its error, failed logins per
client, the Authorization header, and what the log says about exposure.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import time
from collections import OrderedDict
from typing import Protocol


class WebConfigError(Exception):
    """The web config file cannot be used; the message names the file and the setting."""


VERIFYING_CLIENT_AUTH = ("RequireAnyClientCert", "RequireClientCert", "RequireAndVerifyClientCert")


class FailureLimiter:
    """Failed logins per client address: BURST at once, then one per 1/RATE seconds.

    A check spends one of the client's tokens before bcrypt runs (a success gives it back),
    so even many concurrent guesses cannot run more checks than the client has tokens. A
    client without one is refused without a check (429) until it earns another: a password
    guesser gets RATE guesses a second and takes no CPU from anyone else, while a client
    whose login is remembered is never asked. At most MAX_CLIENTS addresses are tracked (the
    least recently seen is forgotten first). Used from the server's event loop only.
    """

    BURST = 10
    RATE = 1.0  # tokens a second earned back
    TARPIT = 1.0  # seconds a refusal without a check is held before it is answered
    MAX_CLIENTS = 10_000

    def __init__(self) -> None:
        self._clients: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def take(self, client: str) -> bool:
        """Spend a token of `client` for a check; False (and nothing spent) when it has none."""
        tokens = self._tokens(client)
        if tokens < 1:
            return False
        self._set(client, tokens - 1)
        return True

    def give_back(self, client: str) -> None:
        self._set(client, self._tokens(client) + 1)

    def _set(self, client: str, tokens: float) -> None:
        self._clients[client] = (min(tokens, float(self.BURST)), time.monotonic())
        self._clients.move_to_end(client)
        while len(self._clients) > self.MAX_CLIENTS:
            self._clients.popitem(last=False)

    def _tokens(self, client: str) -> float:
        tokens, when = self._clients.get(client, (float(self.BURST), 0.0))
        return min(float(self.BURST), tokens + (time.monotonic() - when) * self.RATE)


def parse_basic_auth(header: str | None) -> tuple[str, bytes] | None:
    """(user, password bytes) from an Authorization: Basic header; None when absent or malformed."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, separator, password = decoded.partition(b":")
        return (user.decode(), password) if separator else None
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


# -- exposure ---------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebAccess(Protocol):
    """What the log says of a loaded web config (web_config.LoadedWebConfig), without loading
    that module here."""

    def authenticates(self) -> bool: ...

    def describe(self) -> str: ...


def exposure_warning(host: str, loaded: WebAccess | None) -> str | None:
    """A warning when /metrics can be read by anyone who can reach a non-loopback address."""
    if is_loopback(host) or (loaded is not None and loaded.authenticates()):
        return None
    return (
        f"/metrics is served on {host or '0.0.0.0'} without authentication: anyone who can "
        "reach the port can read it. Set basic_auth_users or client certificates in a web "
        "config file (--web-config, docs/security.md), or listen on 127.0.0.1"
    )


def describe(loaded: WebAccess | None) -> str:
    return "no web config: plain HTTP, no authentication" if loaded is None else loaded.describe()
