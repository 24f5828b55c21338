"""Logging in text or JSON lines, to stderr, with secrets masked in every line: the one home
of secret masking.

Secrets are kept out of messages where they arise (SecretStr settings, `mask_connection_string`
for URLs and DSNs), but libraries quote what they cannot parse: libpq quotes a password with a
bad %-escape, or the words after a password written with a space. So every line, from any
logger, exception text and traceback included, passes through `scrub`: the passwords of any
URL or key=value string in it are masked, and so is every secret value the exporter has read
(`register_secret`, `register_connection_secrets`, `register_model_secrets`: the settings at
start-up, password and DSN files at each read). Uncaught exceptions and warnings are logged
through the same handler.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Hashable
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr

MASK = "****"
MIN_SECRET_LENGTH = 4  # shorter values would mask ordinary words all over the log

# scheme://user:PASSWORD@host and password=VALUE (keyword DSNs, ?password= in URLs)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"']*:)[^\s@\"']*@")
_KEYWORD_PASSWORD = re.compile(
    r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&\"',;]+)", re.IGNORECASE
)
# password=... in a key=value DSN up to the next key=: what an operator meant as the password
# when it has a space and no quotes (libpq then reads its second word as a key and quotes it).
_KEYWORD_PASSWORD_SPAN = re.compile(
    r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|.*?)(?=\s+[A-Za-z_]+\s*=|\s*$)", re.IGNORECASE
)

_secrets: set[str] = set()
_secrets_lock = threading.Lock()
_secrets_longest_first: list[str] = []


def redact(text: str) -> str:
    """`text` with the passwords of any URLs and key=value strings in it replaced by ****."""
    return _KEYWORD_PASSWORD.sub(rf"\1{MASK}", _URL_PASSWORD.sub(rf"\1{MASK}@", text))


def scrub(text: str) -> str:
    """`redact(text)`, then every registered secret in it replaced by ****."""
    text = redact(text)
    for secret in _secrets_longest_first:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def mask_connection_string(dsn: str) -> str:
    """A URL or key=value DSN with its password (user:password@, ?password=, password=...)
    replaced by ****; everything else as written, for messages that name a backend."""
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(rf"\1{MASK}", dsn)
    try:
        parts = urlsplit(dsn)
    except ValueError:  # unparsable (an unclosed [): mask what the patterns find
        return redact(dsn)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:  # hosts taken as written: a bad port must not make this raise
        netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{hosts}"
    query = parts.query
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in pairs):  # redis-py and libpq read ?password= too
        query = urlencode([(k, MASK if k == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def register_secret(value: str | None) -> None:
    """Mask `value` in every log line from now on, as written, percent-decoded and as JSON
    escapes it, and each of its words (a log line may quote one)."""
    if not value:
        return
    forms = {value, value.strip(), unquote(value), json.dumps(value)[1:-1]}
    forms.update(value.split())
    new = {form for form in forms if len(form) >= MIN_SECRET_LENGTH} - _secrets
    if not new:
        return
    global _secrets_longest_first
    with _secrets_lock:
        _secrets.update(new)
        _secrets_longest_first = sorted(_secrets, key=len, reverse=True)


def register_connection_secrets(dsn: str | None) -> None:
    """Register the passwords in a URL (user:password@, ?password=) or key=value DSN."""
    if not dsn:
        return
    _, separator, rest = dsn.partition("://")
    if separator:  # split by hand: urlsplit refuses some of what libpq would quote back
        end = min((at for at in map(rest.find, "/?#") if at >= 0), default=len(rest))
        authority, after = rest[:end], rest[end:]
        userinfo, at, _ = authority.rpartition("@")
        if at and ":" in userinfo:
            register_secret(userinfo.split(":", 1)[1])
        query = after.partition("?")[2].partition("#")[0]
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key == "password":
                register_secret(value)
    for match in _KEYWORD_PASSWORD_SPAN.finditer(dsn):
        written = match.group(1)
        register_secret(written)
        if written.startswith("'"):  # quoted: libpq reads it without quotes and escapes
            register_secret(re.sub(r"\\(.)", r"\1", written.strip("'")))


# Settings holding a URL or DSN: only their passwords are secret. The rest names the backend,
# which the startup report and errors must show ("source redis keys: redis://redis:6379/0").
CONNECTION_STRING_SETTINGS = ("url", "dsn")


def register_model_secrets(model: BaseModel) -> None:
    """Register every SecretStr setting in `model` (nested models, lists and dicts included):
    a URL or DSN setting by its passwords, any other whole (and the passwords in it)."""
    for name, value in _settings(model, ""):
        if isinstance(value, SecretStr):
            secret = value.get_secret_value()
            if name not in CONNECTION_STRING_SETTINGS:
                register_secret(secret)
            register_connection_secrets(secret)


def _settings(node: Any, name: str) -> list[tuple[str, Any]]:
    """(setting name, value) of every leaf; items of a list or dict carry the setting's name."""
    if isinstance(node, BaseModel):
        return [
            leaf
            for field in type(node).model_fields
            for leaf in _settings(getattr(node, field), field)
        ]
    if isinstance(node, list | tuple):
        return [leaf for item in node for leaf in _settings(item, name)]
    if isinstance(node, dict):
        return [leaf for item in node.values() for leaf in _settings(item, name)]
    return [(name, node)]


class RedactingFormatter(logging.Formatter):
    """Formats with `inner`, then scrubs the whole line (exception text and traceback included)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return scrub(self.inner.format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        inner: logging.Formatter = JsonFormatter()
    else:
        inner = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(RedactingFormatter(inner))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python would print these to stderr itself, past the scrubbing.
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(
    kind: type[BaseException], error: BaseException, traceback: TracebackType | None
) -> None:
    logging.getLogger("exporter").critical("uncaught exception", exc_info=(kind, error, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):  # as Python's own hook: a thread's normal exit
        return
    error = args.exc_value or args.exc_type()
    logging.getLogger("exporter").critical(
        "uncaught exception in thread %s",
        args.thread.name if args.thread is not None else "?",
        exc_info=(args.exc_type, error, args.exc_traceback),
    )


class LogLimiter:
    """Logs a repeated warning once per key and period, then says how many were held back.

    Hostile data repeats: one bad item is met every cycle, one refused event may come 100k
    times a second. Each key (for example group and reason) logs its first occurrence at
    once, then at most once per `period` seconds with the count held back in between, so a
    problem is named without flooding the log. At most `max_keys` keys are remembered (the
    oldest is forgotten first), so hostile key names cannot grow memory.
    """

    def __init__(self, logger: logging.Logger, period: float = 300.0, max_keys: int = 1000) -> None:
        self.logger = logger
        self.period = period
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (last logged, held back)

    def log(
        self,
        level: int,
        key: Hashable,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log `message % args` for `key` unless it was logged within the period; True if logged.
        `exc_info`: an error whose traceback goes with the message (as rate-limited as it)."""
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.period:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            held_back = last[1] if last is not None else 0
            self._seen.pop(key, None)
            if len(self._seen) >= self.max_keys:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = (now, 0)
        if held_back:
            message += " (%d more like it since the last report)"
            args = (*args, held_back)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)
