"""The one number check: every value that becomes a sample passes here first.

Values come from v1 event fields (bytes), native records (JSON numbers, hash fields, Redis
counters), worker hashes and SQL rows. Whatever their source, a value is refused unless it is
a finite float within float range, a duration is >= 0, a time lies between the epoch and the
horizon (now plus the clock skew tolerated), and a count is a whole number of plausible size.
A refusal raises InvalidValue with a short, bounded reason (the label of
queue_exporter_events_invalid_total), so it never reaches a sum, a gauge or the renderer.

Every check takes bytes, str, int or float: `float(b"nan")` and a 400-digit JSON integer
are as refused here as they are on the wire.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

DEFAULT_MAX_FUTURE = 300.0  # seconds of clock skew tolerated before a time counts as "future"
# Larger magnitudes are no plausible time or duration; the comparisons also refuse inf and nan.
BIG = 1e15
MAX_COUNT = 1_000_000_000  # workers, slots, attempts, items of one record
MAX_TOTAL = float(2**53)  # a running total (Sidekiq's stat:processed) counts exactly up to here
_MAX_TEXT = 64  # a number written in more characters is no number a queue system writes

REASONS = ("bad_number", "bad_value", "negative_duration", "future_time")

Number = bytes | str | int | float


class InvalidValue(ValueError):
    """A value refused; `reason` is short and bounded (one of wire.INVALID_REASONS)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def horizon(now: float | None = None, max_future: float = DEFAULT_MAX_FUTURE) -> float:
    """The latest time a value may name: now plus the clock skew tolerated."""
    return (time.time() if now is None else now) + max_future


def to_float(value: Number) -> float:
    """The value as a float, refused (bad_number) unless it is one: not a number, too long to
    be one, or an integer beyond float range."""
    if isinstance(value, bytes | str) and len(value) > _MAX_TEXT:
        raise InvalidValue("bad_number", f"a number of {len(value)} characters")
    if isinstance(value, bool) or not isinstance(value, bytes | str | int | float):
        raise InvalidValue("bad_value", f"a {type(value).__name__} where a number belongs")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise InvalidValue("bad_number", shown(value)) from None


def finite(value: Number) -> float:
    """A gauge's or counter's value: a finite float."""
    number = to_float(value)
    if math.isfinite(number):
        return number
    raise InvalidValue("bad_number", shown(value))


def epoch(value: Number, latest: float) -> float:
    """A time: seconds since the epoch, no later than `latest` (horizon())."""
    number = to_float(value)
    if 0 <= number <= latest:
        return number
    if number != number or abs(number) >= BIG:
        raise InvalidValue("bad_number", shown(value))
    raise InvalidValue("future_time" if number > 0 else "bad_value", shown(value))


def epoch_ms(value: Number, latest: float) -> float:
    """A time written in milliseconds since the epoch (Bull's, BullMQ's), in seconds, checked
    as epoch() checks one (`latest` in seconds)."""
    return epoch(to_float(value) / 1000.0, latest)


def due(value: Number) -> float:
    """A time that lies in the future by design (when a scheduled job is due)."""
    number = to_float(value)
    if 0 <= number < BIG:
        return number
    raise InvalidValue("bad_number" if number != number or abs(number) >= BIG else "bad_value")


def seconds(value: Number) -> float:
    """A duration: finite and not negative."""
    number = to_float(value)
    if 0 <= number < BIG:
        return number
    if number != number or abs(number) >= BIG:
        raise InvalidValue("bad_number", shown(value))
    raise InvalidValue("negative_duration", shown(value))


def count(value: Number, minimum: int = 0) -> int:
    """A whole number of things (workers, slots, attempts): minimum..MAX_COUNT."""
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidValue("bad_number" if not math.isfinite(value) else "bad_value")
        value = int(value)
    elif isinstance(value, bytes | str) and len(value) > 20:
        raise InvalidValue("bad_number", shown(value))
    elif isinstance(value, bool) or not isinstance(value, bytes | str | int):
        raise InvalidValue("bad_value", f"a {type(value).__name__} where a count belongs")
    try:
        number = int(value)
    except ValueError:
        raise InvalidValue("bad_number", shown(value)) from None
    if minimum <= number <= MAX_COUNT:
        return number
    raise InvalidValue("bad_number" if abs(number) >= 10**20 else "bad_value", shown(value))


def total(value: Number) -> float:
    """A running total a system keeps (jobs processed ever): 0..MAX_TOTAL."""
    number = to_float(value)
    if 0 <= number <= MAX_TOTAL:
        return number
    raise InvalidValue("bad_number" if not 0 <= number < BIG else "bad_value", shown(value))


def all_finite(values: Iterable[float], non_negative: bool = False) -> bool:
    """True when every value passes finite() (and is not negative): many values checked at
    once, their sum in one C loop (a column of 10k SQL values, a batch's observations).
    False: check them one by one (is_finite) to find which."""
    try:
        if not math.isfinite(sum(values, 0.0)):  # a float sum: huge integers cannot cancel out
            return False
        return not non_negative or min(values, default=0) >= 0
    except (TypeError, ValueError, OverflowError):
        return False


def is_finite(value: Number, non_negative: bool = False) -> bool:
    """finite()'s verdict (and not negative) without raising."""
    try:
        number = finite(value)
    except InvalidValue:
        return False
    return not non_negative or number >= 0


def shown(value: object) -> str:
    """A value in a refusal's detail, short whatever its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, bytes | str):
        return repr(value[:32])
    return repr(value)[:40]
