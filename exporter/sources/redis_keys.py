"""The Redis key sampler: depth and head-of-queue age of every key that matches a key group.

One cycle: find the keys (SCAN MATCH per group, or keys built from enumerated values),
read them in pipelines of `pipeline_size` commands (one depth command per key or priority
band, one for the head item, one for the due count), then one more pipelined round for the
items that point at a hash (RQ jobs, BullMQ jobs) or at a stream position.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import redis
from pydantic import Field

from exporter.catalog import BY_NAME, QUEUE_LABELS, SYSTEM_QUEUE, MetricSpec
from exporter.gc_pause import gc_paused
from exporter.redis_connection import RedisConnectionConfig, redis_error_reason
from exporter.redis_pipeline import round_trip
from exporter.samples import SampleSet
from exporter.sources.item_time import TimeParseError, parse_time
from exporter.sources.key_groups import (
    KeyGroup,
    OldestItem,
    fill,
    key_regex,
    scan_glob,
)
from exporter.telemetry import Telemetry

DEPTH = BY_NAME["queue_depth"]
OLDEST_AGE = BY_NAME["queue_oldest_age_seconds"]
MAX_DEPTH = BY_NAME["queue_max_depth"]

_DEPTH_COMMAND = {"list": "LLEN", "zset": "ZCARD", "set": "SCARD", "hash": "HLEN", "stream": "XLEN"}


class RedisSourceConfig(RedisConnectionConfig):
    sample_interval: float | None = Field(
        None, gt=0, description="seconds between key samples (default: the global interval)"
    )
    scan_count: int = Field(1000, ge=10, description="SCAN COUNT hint")
    pipeline_size: int = Field(1000, ge=1, description="commands per pipelined round trip")
    key_groups: list[KeyGroup] = Field(default_factory=list)


class ItemError(Exception):
    """An item whose time cannot be read; `reason` is the error counter's label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


OnReply = Callable[[Any], "Command | None"]
# A command to pipeline and what its reply means (possibly a follow-up command). A plain tuple:
# a cycle builds one or two per key, so construction cost matters at 100k keys.
Command = tuple[tuple[Any, ...], OnReply]


class Labels(NamedTuple):
    """A queue series' labels, in catalog.QUEUE_LABELS order (so the tuple is the series key)."""

    system: str
    queue: str
    priority: str
    state: str

    def for_metric(self, spec: MetricSpec) -> tuple[str, ...]:
        return self if spec.labels == QUEUE_LABELS else (self.system, self.queue)


assert Labels._fields == QUEUE_LABELS
assert all(spec.labels in (QUEUE_LABELS, SYSTEM_QUEUE) for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH))


class RedisKeySampler:
    def __init__(
        self, config: RedisSourceConfig, telemetry: Telemetry, default_interval: float
    ) -> None:
        self.name = "redis"
        self.config = config
        self.interval = config.sample_interval or default_interval
        self.telemetry = telemetry
        self._client: redis.Redis | None = None
        self._regexes = {group.pattern: key_regex(group.pattern) for group in config.key_groups}

    # -- Source protocol -------------------------------------------------------------------

    def sample(self) -> SampleSet:
        client = self._connect()
        cycle = _Cycle(time.time(), SampleSet(), self.telemetry, self.name)
        # Commands stream through in pipeline-sized rounds while SCAN goes on, so a cycle holds
        # one round of commands at a time, however large the keyspace.
        follow_ups = _Rounds(self, client, None)
        rounds = _Rounds(self, client, follow_ups)
        # A 100k-key cycle builds ~500k short-lived objects: with the cyclic GC running it took
        # 2.6 s, without it 1.7 s (bench/key_sampling.py). The cycle is bounded by its timeouts.
        with gc_paused():
            for group in self.config.key_groups:
                for key, captured in self._keys(client, group):
                    rounds.extend(cycle.commands_for_key(group, key, captured))
            rounds.flush()
            follow_ups.flush()
        return cycle.samples

    def error_reason(self, error: Exception) -> str:
        return redis_error_reason(error)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # -- finding keys and running commands ------------------------------------------------------

    def _connect(self) -> redis.Redis:
        if self._client is None:
            self._client = self.config.connect()
        return self._client

    def _keys(self, client: redis.Redis, group: KeyGroup) -> Iterator[tuple[bytes, dict[str, str]]]:
        if group.enumerated:
            yield from self._enumerated_keys(client, group)
            return
        regex = self._regexes[group.pattern]
        seen: set[bytes] = set()
        for key in client.scan_iter(match=scan_glob(group.pattern), count=self.config.scan_count):
            if key in seen:  # SCAN may return a key twice
                continue
            seen.add(key)
            match = regex.match(key.decode("utf-8", "replace"))
            if match:
                yield key, match.groupdict()

    def _enumerated_keys(
        self, client: redis.Redis, group: KeyGroup
    ) -> Iterator[tuple[bytes, dict[str, str]]]:
        """Keys built from known values: a queue that is empty (its key gone) still reads 0."""
        choices = {name: list(values) for name, values in group.values.items()}
        for name, members in group.values_from_set.items():
            member_regex = key_regex(members.member)
            matches = (member_regex.match(_text(member)) for member in client.smembers(members.key))
            choices[name] = sorted(match.group("value") for match in matches if match)
        names = list(choices)
        for combination in itertools.product(*(choices[name] for name in names)):
            captured = dict(zip(names, combination, strict=True))
            yield fill(group.pattern, captured).encode(), captured

    def execute(self, client: redis.Redis, commands: list[Command]) -> Iterator[Command]:
        """Pipeline the commands in one round trip; yield the follow-ups their replies ask for."""
        replies = round_trip(client, [args for args, _ in commands])
        for (_, on_reply), reply in zip(commands, replies, strict=True):
            if isinstance(reply, redis.ResponseError):
                self.telemetry.count_error(self.name, _response_reason(reply))
                continue
            follow_up = on_reply(reply)
            if follow_up is not None:
                yield follow_up


class _Rounds:
    """Collects commands and sends them a pipeline_size round at a time."""

    def __init__(
        self, sampler: RedisKeySampler, client: redis.Redis, follow_ups: _Rounds | None
    ) -> None:
        self.sampler = sampler
        self.client = client
        self.follow_ups = follow_ups
        self.size = sampler.config.pipeline_size
        self.pending: list[Command] = []

    def extend(self, commands: Iterable[Command]) -> None:
        self.pending.extend(commands)
        if len(self.pending) >= self.size:
            self.flush()

    def flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[: self.size], self.pending[self.size :]
            next_round = self.sampler.execute(self.client, batch)
            if self.follow_ups is not None:
                self.follow_ups.extend(next_round)
            else:
                for _ in next_round:  # follow-ups have no follow-ups of their own
                    pass


class _Cycle:
    """One sample cycle: turns each key into commands whose replies fill `samples`."""

    def __init__(self, now: float, samples: SampleSet, telemetry: Telemetry, source: str) -> None:
        self.now = now
        self.samples = samples
        self.telemetry = telemetry
        self.source = source

    def commands_for_key(
        self, group: KeyGroup, key: bytes, captured: dict[str, str]
    ) -> Iterator[Command]:
        labels = Labels(
            group.system,
            captured.get("queue") or group.labels.get("queue", ""),
            captured.get("priority") or group.labels.get("priority", ""),
            group.state,
        )
        if group.max_depth is not None:
            self.samples.add_labelled(MAX_DEPTH, labels.for_metric(MAX_DEPTH), group.max_depth)
        if group.type == "stream":
            yield from self._stream(group, key, labels)
        elif group.priority_bands is not None:
            yield from self._bands(group, key, labels, captured)
        else:
            yield (_DEPTH_COMMAND[group.type], key), self._record(DEPTH, labels)
            if group.oldest is not None and group.type in ("list", "zset"):
                index = 0 if group.oldest.end == "head" else -1
                read = (
                    ("LINDEX", key, index)
                    if group.type == "list"
                    else ("ZRANGE", key, index, index, "WITHSCORES")
                )
                yield read, self._head_time(group.oldest, labels, captured)
        if group.due is not None:
            limit = self.now * (1000.0 if group.due.unit == "ms" else 1.0) * group.due.divisor
            count_due = ("ZCOUNT", key, "-inf", f"({limit!r}")
            yield count_due, self._record(BY_NAME[group.due.metric], labels)

    def _bands(
        self, group: KeyGroup, key: bytes, labels: Labels, captured: dict[str, str]
    ) -> Iterator[Command]:
        """A zset whose score encodes the priority: depth and head item per band."""
        bands = group.priority_bands
        assert bands is not None
        for band, priority in sorted(bands.names.items()):
            low, high = f"{band * bands.width!r}", f"({(band + 1) * bands.width!r}"
            band_labels = labels._replace(priority=priority)
            yield ("ZCOUNT", key, low, high), self._record(DEPTH, band_labels)
            if group.oldest is None:
                continue
            if group.oldest.end == "tail":
                read: tuple[Any, ...] = ("ZREVRANGEBYSCORE", key, high, low)
            else:
                read = ("ZRANGEBYSCORE", key, low, high)
            yield (
                (*read, "LIMIT", 0, 1, "WITHSCORES"),
                self._head_time(group.oldest, band_labels, captured),
            )

    def _stream(self, group: KeyGroup, key: bytes, labels: Labels) -> Iterator[Command]:
        if group.stream_group:
            yield ("XINFO", "GROUPS", key), self._stream_group(group, key, labels)
            return
        yield ("XLEN", key), self._record(DEPTH, labels)
        if group.oldest is not None:
            first = (
                ("XRANGE", key, "-", "+")
                if group.oldest.end == "head"
                else ("XREVRANGE", key, "+", "-")
            )
            yield (*first, "COUNT", 1), self._stream_head(labels)

    # -- reply handlers --------------------------------------------------------------------

    def _record(self, spec: MetricSpec, labels: Labels) -> OnReply:
        series = labels.for_metric(spec)
        add = self.samples.add_labelled

        def record(reply: Any) -> None:
            add(spec, series, float(reply))

        return record

    def _age(self, labels: Labels, item_time: float) -> None:
        self.samples.add_labelled(OLDEST_AGE, labels, max(0.0, self.now - item_time))

    def _failed_item(self, error: Exception) -> None:
        reason = error.reason if isinstance(error, ItemError) else "time_unparsable"
        self.telemetry.count_error(self.source, reason)

    def _head_time(self, oldest: OldestItem, labels: Labels, captured: dict[str, str]) -> OnReply:
        def on_head(reply: Any) -> Command | None:
            head = _head_item(reply)
            if head is None:
                return None  # empty: no age
            item, score = head
            try:
                if oldest.time_in == "hash":
                    hash_key = fill(oldest.hash_key or "", {**captured, "item": item.decode()})
                    return ("HGET", hash_key, oldest.field), self._hash_time(oldest, labels)
                self._age(labels, _item_time(oldest, item, score))
            except (ItemError, TimeParseError, UnicodeDecodeError) as error:
                self._failed_item(error)
            return None

        return on_head

    def _hash_time(self, oldest: OldestItem, labels: Labels) -> OnReply:
        def on_field(reply: Any) -> None:
            try:
                if reply is None:
                    raise ItemError("time_missing")
                self._age(labels, parse_time(reply, oldest.format, oldest.divisor))
            except (ItemError, TimeParseError) as error:
                self._failed_item(error)

        return on_field

    def _stream_head(self, labels: Labels) -> OnReply:
        def on_entries(reply: Any) -> None:
            if reply:
                self._age(labels, _stream_id_time(reply[0][0]))

        return on_entries

    def _stream_group(self, group: KeyGroup, key: bytes, labels: Labels) -> OnReply:
        wanted = (group.stream_group or "").encode()

        def on_groups(reply: Any) -> Command | None:
            groups = (_as_map(entry) for entry in reply)
            info = next((entry for entry in groups if entry.get(b"name") == wanted), None)
            if info is None:
                self.telemetry.count_error(self.source, "stream_group_missing")
                return None
            self.samples.add_labelled(DEPTH, labels, float(info.get(b"lag") or 0))
            pending = float(info.get(b"pending") or 0)
            self.samples.add_labelled(DEPTH, labels._replace(state="active"), pending)
            if group.oldest is None:
                return None
            # The oldest undelivered entry is the first after the group's last delivered id.
            after = b"(" + info.get(b"last-delivered-id", b"0-0")
            return ("XRANGE", key, after, "+", "COUNT", 1), self._stream_head(labels)

        return on_groups


def _head_item(reply: Any) -> tuple[bytes, float | None] | None:
    """(item, score) from LINDEX (bytes) or ZRANGE ... WITHSCORES: [member, score] in RESP2,
    [[member, score]] in RESP3."""
    if not reply:
        return None
    if isinstance(reply, bytes):
        return reply, None
    member, score = reply[0] if isinstance(reply[0], list) else reply[:2]
    return member, float(score)


def _as_map(reply: Any) -> dict[bytes, Any]:
    """A RESP3 map arrives as a dict, its RESP2 form as a flat [key, value, ...] list."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _item_time(oldest: OldestItem, item: bytes, score: float | None) -> float:
    if oldest.time_in == "score":
        if score is None:
            raise ItemError("time_missing")
        return parse_time(score, oldest.format, oldest.divisor)
    if oldest.time_in == "item":
        return parse_time(item, oldest.format, oldest.divisor)
    text = item.decode("utf-8", "replace")
    if oldest.json_after is not None:
        _, separator, text = text.partition(oldest.json_after)
        if not separator:
            raise ItemError("item_not_json")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ItemError("item_not_json") from error
    value = document.get(oldest.field) if isinstance(document, dict) else None
    if value is None or isinstance(value, dict | list):
        raise ItemError("time_missing")
    return parse_time(value, oldest.format, oldest.divisor)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _stream_id_time(entry_id: bytes) -> float:
    return int(entry_id.split(b"-", 1)[0]) / 1000.0


def _response_reason(error: redis.ResponseError) -> str:
    return "wrong_type" if str(error).startswith("WRONGTYPE") else "response_error"
