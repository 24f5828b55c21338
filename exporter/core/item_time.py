"""Turning the times queue systems store (ISO-8601 strings, epoch seconds or milliseconds) into epoch seconds."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Literal

TimeFormat = Literal["auto", "iso", "epoch_s", "epoch_ms"]

# Epoch values above this are milliseconds: 1e11 seconds is the year 5138, 1e11 ms is 1973.
_MS_THRESHOLD = 1e11
# fromisoformat accepts at most 6 fractional digits; RFC 3339 writers (chrono) emit up to 9.
_LONG_FRACTION = re.compile(r"(\.\d{6})\d+")


class TimeParseError(ValueError):
    """A stored time that is not in the expected format."""


def parse_time(
    raw: str | bytes | float | int, fmt: TimeFormat = "auto", divisor: float = 1.0
) -> float:
    """Return epoch seconds for a stored time, or raise TimeParseError naming what was wrong."""
    number = None if fmt == "iso" else _as_number(raw)  # float() reads bytes as it reads text
    if number is None:
        if fmt == "iso" or (fmt == "auto" and isinstance(raw, (str, bytes))):
            return _parse_iso(_text(raw))
        raise TimeParseError(f"not a number: {_shown(raw)}")
    number /= divisor
    if not math.isfinite(number):  # a huge number over a small divisor
        raise TimeParseError(f"out of range: {_shown(raw)}")
    if fmt == "epoch_ms" or (fmt == "auto" and abs(number) >= _MS_THRESHOLD):
        return number / 1000.0
    return number


def _shown(raw: str | bytes | float | int) -> str:
    """A stored value for an error message; a huge integer is not turned into digits."""
    return repr(_text(raw)[:64]) if isinstance(raw, (str, bytes)) else type(raw).__name__


def _text(raw: str | bytes | float | int) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _as_number(raw: str | bytes | float | int) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (ValueError, OverflowError):  # not a number, or an integer beyond any float
        return None
    return value if math.isfinite(value) else None


def _parse_iso(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(_LONG_FRACTION.sub(r"\1", text.strip()))
        except ValueError as error:
            raise TimeParseError(f"not an ISO-8601 time: {text[:64]!r}") from error
    if parsed.tzinfo is None:  # the systems we read write UTC without saying so
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
