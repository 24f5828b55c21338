"""Logging in text or JSON lines, to stderr, with passwords masked in every line.

Secrets are kept out of messages where they arise (SecretStr settings, masked URLs and DSNs),
but libraries quote connection strings in some of their own errors (libpq quotes a whole URI
it cannot parse). So every formatted line, from any logger, also passes through `redact`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Hashable

# scheme://user:PASSWORD@host and password=VALUE (keyword DSNs, ?password= in URLs)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"']*:)[^\s@\"']*@")
_KEYWORD_PASSWORD = re.compile(
    r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&\"',;]+)", re.IGNORECASE
)


def redact(text: str) -> str:
    """`text` with the passwords of any URLs and key=value strings in it replaced by ****."""
    return _KEYWORD_PASSWORD.sub(r"\1****", _URL_PASSWORD.sub(r"\1****@", text))


class RedactingFormatter(logging.Formatter):
    """Formats with `inner`, then masks passwords in the whole line (traceback included)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


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

    def log(self, level: int, key: Hashable, message: str, *args: object) -> bool:
        """Log `message % args` for `key` unless it was logged within the period; True if logged."""
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
        self.logger.log(level, message, *args)
        return True

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)
