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
import time

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
