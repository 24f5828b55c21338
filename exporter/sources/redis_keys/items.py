"""What a queue item read from Redis says: its time, a label inside it, the reason it cannot be
read.

Replies come as the server sends them, RESP2 or RESP3 (sources/redis_keys/commands.py sends the reads); a time
is read from a zset score, the item itself, a field of its JSON, a stream entry's id, or the hash
field or string key the item names (kept_where, kept_time). What hostile data raises is named
by a fixed table of reasons, so it cannot grow the error label.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import redis

from exporter.core import numbers
from exporter.core.item_time import TimeParseError, parse_time
from exporter.redis.pipeline import Args, script_read
from exporter.sources.redis_keys.groups import (
    DueCount,
    LabelFromItems,
    OldestItem,
    ScoreWindow,
    fill,
)

# time_in prefix: the bytes of the big-endian unsigned integer an item starts with
PREFIX_BYTES = 8
# time_in signed: Django's base-62 digits (django.core.signing.b62_encode), their values
_BASE62 = {
    digit: value
    for value, digit in enumerate(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
}
# a signing time of more base-62 digits is past any epoch second a clock gives (62^7 > 3.5e12)
_BASE62_MAX_DIGITS = 7


class ItemError(Exception):
    """An item whose time cannot be read; `reason` is the error counter's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Exceptions a reply handler may meet in hostile data, and their reason; anything else is
# item_unreadable. A fixed table, so hostile data cannot grow the reason label.
_EXCEPTION_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (TimeParseError, "time_unparsable"),
    (RecursionError, "item_too_deep"),
    (UnicodeDecodeError, "item_not_utf8"),
)


def scores_now(now: float, scores: DueCount | ScoreWindow) -> float:
    """The time `now` as a score of a zset whose scores are times in that unit and divisor."""
    return now * (1000.0 if scores.unit == "ms" else 1.0) * scores.divisor


def head_item(reply: Any) -> tuple[bytes, float | None] | None:
    """(item, score) from LINDEX (bytes) or ZRANGE ... WITHSCORES: [member, score] in RESP2,
    [[member, score]] in RESP3."""
    if isinstance(reply, bytes):  # an empty string is an item too (not JSON, not a time)
        return reply, None
    if not reply:
        return None
    member, score = reply[0] if isinstance(reply[0], list) else reply[:2]
    return member, float(score)


def listed_items(reply: Any, scored: bool) -> list[tuple[bytes | int, float | None]]:
    """(item, score) pairs of LRANGE / HVALS, or of ZRANGE ... WITHSCORES: a flat
    [member, score, ...] list in RESP2, [[member, score], ...] in RESP3. An item over
    max_item_bytes is its size (bound_each)."""
    if not scored:
        return [(item, None) for item in reply]
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(member, float(score)) for member, score in zip(reply[::2], reply[1::2], strict=True)]


def split_value(split: LabelFromItems, item: bytes | int, score: float | None) -> str | None:
    """The label value split_by reads from an item (an int: its size, the item over
    max_item_bytes and left in Redis) or its score; None when there is none to read."""
    if split.score is not None:
        if score is None:
            return None
        number = -score if split.score == "negated" else score
        return str(int(number)) if number.is_integer() else repr(number)
    if isinstance(item, int) or split.field is None:
        return None
    return json_field(item, split.field)


def json_field(item: bytes, field: str) -> str | None:
    """A field of the item's JSON as a label value; None when there is none to read (not JSON,
    nested past the recursion limit, no such string field): the item counts as __unread__."""
    try:
        value = _json_value(item, (field,))
    except (ItemError, RecursionError):
        return None
    return value if isinstance(value, str) and value else None


def _json_value(document: str | bytes, path: Iterable[str | None], unwritten: bool = False) -> Any:
    """The value at `path` (the names of nested objects) of a JSON document: a queue item's
    time, or a kept one (Dramatiq's messages, Bee-Queue's jobs in a hash keyed by id).
    `unwritten`: a value absent, null or 0 (a time not written yet) is None, not an error."""
    try:
        value = json.loads(document)
    except ValueError as error:
        raise ItemError("item_not_json") from error
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    if unwritten and (value is None or (type(value) in (int, float) and value == 0)):
        return None
    if value is None or isinstance(value, (dict, list)):  # a tuple: no union built per call
        raise ItemError("time_missing")
    return value


def as_map(reply: Any) -> dict[bytes, Any]:
    """A RESP3 map arrives as a dict, its RESP2 form as a flat [key, value, ...] list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def item_time(oldest: OldestItem, item: bytes, score: float | None) -> float:
    if oldest.time_in == "score":
        if score is None:
            raise ItemError("time_missing")
        return parse_time(score, oldest.format, oldest.divisor)
    if oldest.time_in == "item":
        return parse_time(item, oldest.format, oldest.divisor)
    if oldest.time_in == "prefix":
        if len(item) < PREFIX_BYTES:
            raise ItemError("time_missing")
        return parse_time(int.from_bytes(item[:PREFIX_BYTES], "big"), oldest.format, oldest.divisor)
    if oldest.time_in == "signed":
        return signed_at(item)
    text = item.decode("utf-8", "replace")
    if oldest.json_after is not None:
        _, separator, text = text.partition(oldest.json_after)
        if not separator:
            raise ItemError("item_not_json")
    return parse_time(_json_value(text, (oldest.field,)), oldest.format, oldest.divisor)


def signed_at(token: bytes) -> float:
    """The time (epoch seconds) a Django signing.dumps token was signed: TimestampSigner writes
    <payload>:<base-62 seconds>:<signature> (django-q2 signs each task it queues so). The
    payload is neither decoded nor trusted: it is a pickle, and the signature is not checked
    (that needs the application's SECRET_KEY), so a forged token reads the time it claims."""
    parts = token.rsplit(b":", 2)
    if len(parts) != 3 or not 0 < len(parts[1]) <= _BASE62_MAX_DIGITS:
        raise ItemError("time_missing")
    seconds = 0
    for digit in parts[1]:
        value = _BASE62.get(digit)
        if value is None:
            raise ItemError("time_missing")
        seconds = seconds * 62 + value
    return float(seconds)


# A JSON document parsed without json.loads's layers (its checks for bytes and for whitespace
# around the document cost as much as the parse of a small queue item itself).
_parse_document = json.JSONDecoder().raw_decode
_from_iso = datetime.fromisoformat
# What a JSON item's time field may be for parse_time; anything else goes to item_time.
_TIME_VALUES = (str, int, float)


def head_time(oldest: OldestItem) -> Callable[[Any], float | None]:
    """The time of the item a head read returned (LINDEX's item, ZRANGE's member and score;
    None for an empty queue), as head_item and item_time read it, for a loop over many keys.

    A list's JSON item (the common layout) is read the short way when it is a plain JSON
    object: decoded strictly, parsed whole from its first character, its field a string or a
    number. Any other reply goes the general way, which reads it as it always did or raises
    what is wrong with it: both ways give the same time or the same error. At 100k keys a
    cycle cost 1.2-1.5x the floor's CPU with the short way, 1.5-1.7x without it
    (docs/benchmarks.md)."""

    def general(reply: Any) -> float | None:
        head = head_item(reply)
        return None if head is None else item_time(oldest, *head)

    field = oldest.field
    if oldest.time_in != "json" or oldest.json_after is not None or field is None:
        return general
    time_format, divisor = oldest.format, oldest.divisor
    iso = time_format == "iso"

    def json_item(reply: Any) -> float | None:
        if type(reply) is bytes:
            try:
                text = reply.decode()
                document, end = _parse_document(text)
                value, whole = document[field], end == len(text)
                if whole and iso and type(value) is str:
                    parsed = _from_iso(value)  # as parse_time reads it, when it has its offset
                    if parsed.tzinfo is not None:
                        return parsed.timestamp()
                elif whole and type(value) in _TIME_VALUES:
                    return parse_time(value, time_format, divisor)
            except Exception:  # hostile data may raise anything: the general way names it
                pass
        return general(reply)

    return json_item


def kept_where(oldest: OldestItem, captured: dict[str, str], item: bytes) -> tuple[bytes, Args]:
    """The key, and its read, of the time a head item names (its hash's field, or a string
    key's JSON): RQ's, BullMQ's and Bull's job ids."""
    named = item.decode()
    if oldest.item_until is not None:
        named = named.partition(oldest.item_until)[0]
    values = {**captured, "item": named}
    if oldest.time_in == "hash":
        key, field = fill(oldest.hash_key or "", values), oldest.field or ""
        if "{" in field:  # else a field of every hash alike (Bull's timestamp): no fill each
            field = fill(field, values)
        return key.encode(), script_read("HGET", field)
    return fill(oldest.string_key or "", values).encode(), script_read("GET")


def kept_time(oldest: OldestItem, reply: Any) -> float | None:
    """The time a hash field or string key keeps: the reply of its read (kept_where). A time
    absent, null or 0 (not written yet), or a key gone since its head was read: None where
    on_missing skips it, else ItemError time_missing."""
    skip = oldest.on_missing == "skip"
    if reply is not None and oldest.json_field is not None:
        reply = _json_value(reply, oldest.json_field.split("."), skip)
    if reply is None or (skip and reply in (b"0", "0")):
        if skip:
            return None
        raise ItemError("time_missing")
    return parse_time(reply, oldest.format, oldest.divisor)


def checked_time(at: float, latest: float) -> float:
    """A head item's time as numbers.epoch takes every time a sample is made of (the v1 event
    path's rule): from 1970 to `latest` (now plus the clock skew tolerated). Before or beyond,
    ItemError time_out_of_range: no age is made of it (a head time of -5 s gave 57 years, an
    arq score of -1e300 gave 1e297 s)."""
    try:
        return numbers.epoch(at, latest)
    except numbers.InvalidValue as error:
        raise ItemError("time_out_of_range") from error


def stream_head_time(reply: Any) -> float | None:
    """The time of a stream's first entry (XRANGE ... COUNT 1): its id's millisecond part."""
    return int(reply[0][0].split(b"-", 1)[0]) / 1000.0 if reply else None


def exception_reason(error: Exception) -> str:
    """The reason label for what a reply handler raised."""
    if isinstance(error, ItemError):
        return error.reason
    for kind, reason in _EXCEPTION_REASONS:
        if isinstance(error, kind):
            return reason
    return "item_unreadable"


def response_reason(error: redis.ResponseError) -> str:
    message = str(error)
    if message.startswith("WRONGTYPE"):
        return "wrong_type"
    if message.startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN")):
        return "slot_moved"
    if message.removeprefix("ERR ").startswith("no such key"):  # XINFO GROUPS, no stream
        return "stream_missing"
    return "response_error"
