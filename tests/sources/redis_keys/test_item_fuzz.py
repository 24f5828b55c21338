"""Hypothesis writes hostile heads of queues, in every item-time form, into a real Redis.

For each form a key group supports (list head or tail, JSON field with or without a separator,
the item itself, a field of the hash the item names, zset score, zset member, priority bands,
stream entry id, a consumer group's first unread entry), arbitrary JSON (deep nesting, huge
integers, odd floats, any string) or bytes that are no JSON at all are put at the head of one
queue, beside a healthy queue of another system. Whatever is there: the cycle never raises,
the other system's queue keeps its depth and age, the hostile queue keeps its depth, and its
age is either served (finite, not negative) or skipped with the error counted on its group
(`max_item_bytes` is drawn too: tiny, so most heads are over it, or the default).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.layouts import iso

HOSTILE, HOSTILE_PATTERN = "hostile:q", "hostile:{queue}"
CONTROL, CONTROL_PATTERN = "control:q", "control:{queue}"
CONTROL_AGE = 60.0

# -- what Hypothesis writes ------------------------------------------------------------------

huge_integers = st.integers(min_value=-(10**400), max_value=10**400)
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e300, -1e300, 5e-324])
times = st.one_of(
    st.floats(),
    odd_floats,
    huge_integers,
    st.integers(),
    st.text(),
    st.sampled_from(["2026-11-29T18:30:15Z", "9999-12-31T23:59:59-23:59", "0001-01-01", "1e400"]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | odd_floats | huge_integers | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=12,
)


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """A JSON item: usually a dict whose field `t` is hostile, else any JSON at all."""
    if draw(st.booleans()):
        body: Any = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
        body["t"] = draw(st.one_of(times, json_values))
        if draw(st.booleans()):  # the field split_by reads a label from
            body["q"] = draw(st.one_of(st.text(max_size=8), json_values))
    else:
        body = draw(json_values)
    return json.dumps(body).encode()  # NaN and Infinity as Python writes them


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    depth = draw(st.sampled_from([999, 1000, 5000, 100_000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"t":', "}")]))
    return b'{"t": ' + (opener * depth + "1" + closer * depth).encode() + b"}"


items = st.one_of(
    documents(),
    deep_nesting(),
    st.binary(max_size=64),  # not JSON, not UTF-8
    st.text(max_size=64).map(str.encode),
    documents().map(lambda document: b"uuid:" + document),  # a separator before the JSON
    times.map(lambda value: str(value).encode()),  # the item itself is the time
)
formats = st.sampled_from(["auto", "iso", "epoch_s", "epoch_ms"])
divisors = st.sampled_from([1.0, 1000.0, 4096.0, 1e-300])
item_limits = st.sampled_from([64, 256 * 1024])  # max_item_bytes: tiny, or the default


# -- the forms ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """One way a key group reads an item's time, and how to put a hostile item there."""

    name: str
    type: str
    oldest: dict[str, Any]
    extra: dict[str, Any] | None = None

    def group(self, fmt: str, divisor: float) -> dict[str, Any]:
        oldest = {**self.oldest}
        if oldest["time_in"] != "stream_id":
            oldest |= {"format": fmt, "divisor": divisor}
        group = {
            "system": "hostile",
            "pattern": HOSTILE_PATTERN,
            "type": self.type,
            "state": "pending",
        }
        return group | {"oldest": oldest} | (self.extra or {})


FORMS = [
    Form("list head json", "list", {"end": "head", "time_in": "json", "field": "t"}),
    Form(
        "list tail json after ':'",
        "list",
        {"end": "tail", "time_in": "json", "field": "t", "json_after": ":"},
    ),
    Form("list head item", "list", {"end": "head", "time_in": "item"}),
    Form("list head hash", "list", {"time_in": "hash", "hash_key": "h:{item}", "field": "t"}),
    Form("zset head score", "zset", {"end": "head", "time_in": "score"}),
    Form("zset tail member json", "zset", {"end": "tail", "time_in": "json", "field": "t"}),
    Form("zset head member item", "zset", {"end": "head", "time_in": "item"}),
    Form("zset head hash", "zset", {"time_in": "hash", "hash_key": "h:{item}", "field": "t"}),
    Form(
        "zset priority bands, json after ':'",
        "zset",
        {"end": "tail", "time_in": "json", "field": "t", "json_after": ":"},
        {"priority_bands": {"width": 1e6, "names": {0: "low", 1: "high"}}},
    ),
    Form(
        "zset split by a JSON field, head",
        "zset",
        {"end": "head", "time_in": "json", "field": "t"},
        {"split_by": {"label": "priority", "field": "q"}},
    ),
    Form(
        "list split by a JSON field, tail",
        "list",
        {"end": "tail", "time_in": "json", "field": "t"},
        {"split_by": {"label": "priority", "field": "q"}},
    ),
    Form(
        "zset due window, head score",
        "zset",
        {"end": "head", "time_in": "score"},
        {"scores": {"window": "due", "unit": "ms"}},
    ),
    Form(
        "zset due window, head hash",
        "zset",
        {"time_in": "hash", "hash_key": "h:{item}", "field": "t"},
        {"scores": {"window": "due", "unit": "s"}},
    ),
    Form(
        "list head, JSON in a hash field named by the item",
        "list",
        {"time_in": "hash", "hash_key": "h:all", "field": "{item}", "json_field": "t"},
    ),
    Form(
        "list head, JSON string key named by the item",
        "list",
        {"time_in": "string", "string_key": "h:{item}", "json_field": "t"},
    ),
    Form(
        "zset positive scores, head JSON string key",
        "zset",
        {"time_in": "string", "string_key": "h:{item}", "json_field": "t"},
        {"scores": {"window": "positive"}},
    ),
    Form("stream head id", "stream", {"end": "head", "time_in": "stream_id"}),
    Form("stream tail id", "stream", {"end": "tail", "time_in": "stream_id"}),
    Form(
        "stream consumer group first unread",
        "stream",
        {"time_in": "stream_id"},
        {"stream_group": "workers"},
    ),
]


@dataclass
class Hostile:
    """What one example puts into Redis."""

    item: bytes
    score: float
    hash_field: bytes | None  # None: the hash the item names is missing
    hash_of_another_type: bool
    entry_ms: int
    fields: dict[bytes, bytes]
    group_position: str  # where the consumer group was created: "0", "$" or "none"
    document: bytes  # the JSON (or not) a hash field named by the item holds


hostile_writes = st.builds(
    Hostile,
    item=items,
    score=st.floats(allow_nan=False),
    hash_field=st.none() | times.map(lambda value: str(value)[:200].encode()) | st.binary(),
    hash_of_another_type=st.booleans(),
    entry_ms=st.integers(min_value=1, max_value=2**64 - 1),
    fields=st.dictionaries(st.binary(min_size=1, max_size=8), st.binary(max_size=64), min_size=1),
    group_position=st.sampled_from(["0", "$", "none"]),
    document=items,
)


def write(client: redis.Redis, form: Form, hostile: Hostile) -> None:
    """Put the hostile item at the head of the form's key (and the hash it names)."""
    if form.type == "list":
        client.rpush(HOSTILE, hostile.item)
    elif form.type == "zset":
        client.zadd(HOSTILE, {hostile.item: hostile.score})
    else:
        client.xadd(HOSTILE, hostile.fields, id=f"{hostile.entry_ms}-0")
        if form.extra and hostile.group_position != "none":
            client.xgroup_create(HOSTILE, "workers", id=hostile.group_position)
    if form.oldest["time_in"] == "string":  # a JSON string key per item
        if hostile.hash_of_another_type:
            client.rpush(b"h:" + hostile.item, b"not a string")
        elif hostile.hash_field is not None:
            client.set(b"h:" + hostile.item, hostile.document)
    elif form.oldest.get("field") == "{item}":  # one hash, a field per item
        if hostile.hash_of_another_type:
            client.rpush(b"h:all", b"not a hash")
        elif hostile.hash_field is not None:
            client.hset(b"h:all", hostile.item, hostile.document)
    elif form.oldest["time_in"] == "hash":
        hash_key = b"h:" + hostile.item
        if hostile.hash_of_another_type:
            client.rpush(hash_key, b"not a hash")
        elif hostile.hash_field is not None:
            client.hset(hash_key, b"t", hostile.hash_field)


# -- the test ------------------------------------------------------------------------------------


def _series(samples: Any) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (spec.name, labels): value
        for spec, series in samples.metrics()
        for labels, value in series.items()
    }


@pytest.mark.parametrize("form", FORMS, ids=[form.name for form in FORMS])
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=hostile_writes, fmt=formats, divisor=divisors, limit=item_limits)
def test_a_hostile_head_fails_only_its_own_age(
    redis_client, redis_url, form, hostile, fmt, divisor, limit
):
    client: redis.Redis = redis_client
    client.delete(HOSTILE, CONTROL, *client.keys(b"h:*"))
    client.rpush(CONTROL, json.dumps({"t": iso(time.time() - CONTROL_AGE)}))
    write(client, form, hostile)
    control = {"system": "control", "pattern": CONTROL_PATTERN, "type": "list", "state": "pending"}
    control["oldest"] = {"time_in": "json", "field": "t", "format": "iso"}
    groups = [form.group(fmt, divisor), control]
    config = RedisSourceConfig(url=redis_url, key_groups=groups, max_item_bytes=limit)
    sampler = RedisKeySampler(config, 15.0)
    try:
        cycle = sampler.sample()  # never raises: the source stays up
    finally:
        sampler.close()

    series = _series(cycle.samples)
    assert series[("queue_depth", ("control", "q", "", "pending"))] == 1
    control_age = series[("queue_oldest_age_seconds", ("control", "q", "", "pending"))]
    assert CONTROL_AGE <= control_age < CONTROL_AGE + 600

    report = next(report for report in cycle.key_groups or [] if report.pattern == HOSTILE_PATTERN)
    hostile_series = {
        name: [
            v for (metric, labels), v in series.items() if metric == name and labels[0] == "hostile"
        ]
        for name in ("queue_depth", "queue_oldest_age_seconds")
    }
    consumer_group = form.extra == {"stream_group": "workers"}
    if consumer_group and hostile.group_position == "none":
        assert report.errors == {"stream_group_missing": 1}
        return
    assert hostile_series["queue_depth"], "the hostile queue keeps its depth"
    if form.extra is not None and "split_by" in form.extra:
        assert sum(hostile_series["queue_depth"]) == 1  # under the label read, or __unread__
    ages = hostile_series["queue_oldest_age_seconds"]
    for age in ages:
        assert math.isfinite(age) and age >= 0
    if not ages:  # skipped: counted, unless there was no item to read
        nothing_unread = consumer_group and hostile.group_position == "$"
        banded_out = (
            form.extra is not None
            and "priority_bands" in form.extra
            and not 0 <= hostile.score < 2e6
        )
        # a score window holds no item when the hostile score lies ahead of now
        window = (form.extra or {}).get("scores")
        scale = 1000.0 if window and window.get("unit") == "ms" else 1.0
        ahead = hostile.score > time.time() * scale
        if window is not None and window["window"] == "positive":
            ahead = hostile.score <= 0
        windowed_out = window is not None and ahead
        assert sum(report.errors.values()) >= 1 or nothing_unread or banded_out or windowed_out, (
            report
        )
