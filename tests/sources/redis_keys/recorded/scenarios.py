"""What the recordings hold: per scenario, the keys written into a real Redis (from the seed
documents' layouts, tests/seeds.py and tests/layouts.py, and RQ's documented one) and the
truth about them, taken from what is written here, never from the exporter's output.

Every time is fixed (NOW and offsets from it), every id too, so a recording made again on a
live Redis is the same, byte for byte (test_recordings_current.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis

from tests import layouts, seeds
from tests.layouts import iso

# The cycle's clock in every recording: a fixed moment, so ages and due counts are exact.
NOW = 1_767_500_000.0
MAX_ITEM_BYTES = 1024
# Small rounds: a round ends inside a run of keys, and the follow-ups of one round go in another.
PIPELINE_SIZE = 5


@dataclass
class Truth:
    """What the written keys hold, per series (queue, priority, state), per queue, per group."""

    depths: dict[tuple[str, str, str], float] = field(default_factory=dict)
    ages: dict[tuple[str, str, str], float] = field(default_factory=dict)
    due: dict[tuple[str, str], float] = field(default_factory=dict)  # (metric, queue)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)  # per group pattern


@dataclass
class Scenario:
    name: str
    system: str
    config: dict[str, Any]  # the configuration's sources.redis, presets included
    truth: Truth
    writes: list[tuple[Any, ...]]  # the commands that write its keys

    def write(self, client: redis.Redis) -> None:
        for command in self.writes:
            client.execute_command(*command)

    def found_keys(self) -> list[bytes]:
        """The keys written, in order: what a SCAN would find (its order is Redis's hash order,
        which varies between servers, so the recordings give the keys instead)."""
        return sorted({str(command[1]).encode() for command in self.writes})


def _settings(presets: list[Any]) -> dict[str, Any]:
    return {
        "presets": presets,
        "sources": {
            "redis": {
                "url": "redis://127.0.0.1:6379/0",  # never connected: the recording answers
                "max_item_bytes": MAX_ITEM_BYTES,
                "pipeline_size": PIPELINE_SIZE,
            }
        },
    }


# -- Orchestrata (seed 002): a list per recipient and priority, JSON items, a dead-letter list --


def _orchestrata_message(recipient: str, priority: int, queued_at: float, number: int) -> str:
    values = {
        "packet": {"type": "task", "payload": {"n": number}},
        "queued_at": iso(queued_at),
        "priority": priority,
        "recipient": recipient,
        "message_id": f"m-{recipient}-{priority}-{number}",
    }
    fields = seeds.orchestrata_fields("message_data")
    assert sorted(values) == sorted(fields), f"the seed's message_data fields: {fields}"
    return json.dumps({name: values[name] for name in fields})


def _orchestrata_dead(recipient: str, failed_at: float, number: int) -> str:
    values = {
        "message_id": f"d-{recipient}-{number}",
        "recipient": recipient,
        "failed_at": iso(failed_at),
        "reason": "Message expired",
        "metadata": {},
    }
    fields = seeds.orchestrata_fields("dlq_entry")
    assert sorted(values) == sorted(fields), f"the seed's dlq_entry fields: {fields}"
    return json.dumps({name: values[name] for name in fields})


def orchestrata() -> Scenario:
    templates = seeds.orchestrata_key_templates()

    def queue(recipient: str, priority: int) -> str:
        return templates["_queue_key"].format(recipient=recipient, priority=priority)

    truth = Truth()
    writes: list[tuple[Any, ...]] = []
    # RPUSH in, LPOP out: the head is the first queued
    good = {("billing", 0): [300, 120, 5], ("billing", 2): [40], ("mail", 0): [7200, 60]}
    for (recipient, priority), offsets in good.items():
        items = [
            _orchestrata_message(recipient, priority, NOW - offset, number)
            for number, offset in enumerate(offsets)
        ]
        writes.append(("RPUSH", queue(recipient, priority), *items))
        series = (recipient, str(priority), "pending")
        truth.depths[series] = len(offsets)
        truth.ages[series] = offsets[0]
    dead = templates["_dlq_key"].format(recipient="billing")
    writes.append(
        (
            "RPUSH",
            dead,
            *(_orchestrata_dead("billing", NOW - s, n) for n, s in enumerate((900, 30))),
        )
    )
    truth.depths["billing", "", "dead_letter"] = 2
    truth.ages["billing", "", "dead_letter"] = 900
    # Heads whose time cannot be read: the depth counts, no age is made up
    message = _orchestrata_message
    broken = {
        "garbled": ["{not json", message("garbled", 0, NOW - 10, 1)],  # item_not_json
        "future": [message("future", 0, NOW + 3600, 0)],  # time_out_of_range
        "yesterday": [message("yesterday", 0, NOW, 0).replace(iso(NOW), "yesterday-ish")],
        "notime": [json.dumps({"packet": {}, "recipient": "notime"})],  # time_missing
        "huge": [message("huge", 0, NOW - 10, 0).replace('"task"', '"' + "x" * 2000 + '"')],
    }
    for recipient, items in broken.items():
        writes.append(("RPUSH", queue(recipient, 0), *items))
        truth.depths[recipient, "0", "pending"] = len(items)
    # A key of the pattern holding another type: counted as wrong_type, no series
    writes.append(("HSET", queue("wrongtype", 0), "field", "value"))
    truth.errors["orchestrata:queue:{queue}:p{priority}"] = {
        "item_not_json": 1,
        "time_out_of_range": 1,
        "time_unparsable": 1,
        "time_missing": 1,
        "item_too_large": 1,
        "wrong_type": 1,
    }
    truth.errors["orchestrata:dlq:{queue}"] = {}
    return Scenario("orchestrata", "orchestrata", _settings(["orchestrata"]), truth, writes)


# -- Runner-Q (queue-layouts.md section 2): a priority zset banded by score, and four more -------


def _uuid(number: int) -> str:
    return f"00000000-0000-4000-8000-{number:012d}"


def runnerq() -> Scenario:
    truth = Truth()
    writes: list[tuple[Any, ...]] = []
    names = {weight: name.lower() for name, weight in seeds.runnerq_priority_weights().items()}
    # ZPOPMAX serves the highest score: within a priority's million, the earliest created
    pending = {"Low": [50], "Normal": [400, 20], "High": [10]}
    members: list[Any] = []
    number = 0
    for priority, offsets in pending.items():
        for offset in offsets:
            number += 1
            activity = layouts.runnerq_activity("charge", priority, NOW - offset, _uuid(number))
            members += [
                layouts.runnerq_score(priority, NOW - offset),
                layouts.runnerq_member(activity),
            ]
    writes.append(("ZADD", "default:priority_queue", *members))
    weights = seeds.runnerq_priority_weights()
    for priority, name in names.items():
        offsets = next((o for p, o in pending.items() if weights[p] == priority), [])
        truth.depths["default", name, "pending"] = len(offsets)
        if offsets:
            truth.ages["default", name, "pending"] = max(offsets)
    # processing: scored by lease deadline in ms; one lease has run out
    writes.append(
        ("ZADD", "default:processing", (NOW - 30) * 1000, _uuid(90), (NOW + 60) * 1000, _uuid(91))
    )
    truth.depths["default", "", "active"] = 2
    truth.due["queue_leases_expired", "default"] = 1
    # scheduled: scored by due time in s; one is due
    writes.append(
        ("ZADD", "default:scheduled_activities", NOW - 5, _uuid(80), NOW + 3600, _uuid(81))
    )
    truth.depths["default", "", "scheduled"] = 2
    truth.due["queue_scheduled_due", "default"] = 1
    dead = layouts.runnerq_activity("charge", "High", NOW - 4000, _uuid(70))
    entry = {
        "activity": dead,
        "error": "card declined",
        "failed_at": layouts.rfc3339_nanos(NOW - 600),
    }
    writes.append(("RPUSH", "default:dead_letter_queue", json.dumps(entry)))
    truth.depths["default", "", "dead_letter"] = 1
    truth.ages["default", "", "dead_letter"] = 600
    writes.append(
        (
            "ZADD",
            "default:completed_activities",
            *(x for n in range(3) for x in (NOW - n, _uuid(60 + n))),
        )
    )
    truth.depths["default", "", "completed"] = 3
    # A queue whose oldest pending member's JSON is cut short, and whose dead letter's time
    # is no time: their bands and list count, without an age
    writes.append(
        (
            "ZADD",
            "cut:priority_queue",
            layouts.runnerq_score("Normal", NOW - 70),
            f'{_uuid(50)}:{{"id": ',
        )
    )
    for name in names.values():
        truth.depths["cut", name, "pending"] = 1 if name == "normal" else 0
    cut_dead = {**entry, "failed_at": "the day before"}
    writes.append(("RPUSH", "cut:dead_letter_queue", json.dumps(cut_dead)))
    truth.depths["cut", "", "dead_letter"] = 1
    truth.errors = {
        "{queue}:priority_queue": {"item_not_json": 1},
        "{queue}:processing": {},
        "{queue}:scheduled_activities": {},
        "{queue}:dead_letter_queue": {"time_unparsable": 1},
        "{queue}:completed_activities": {},
    }
    return Scenario("runnerq", "runnerq", _settings(["runnerq"]), truth, writes)


# -- RQ (its documented layout, tests/layouts.py): queues named by a set, times in job hashes --


def _rq_stamp(epoch: float) -> str:
    return iso(epoch).replace("+00:00", "Z")


def rq() -> Scenario:
    truth = Truth()
    writes: list[tuple[Any, ...]] = []
    queues = {"default": [600, 60, 6], "high": [30], "low": [], "broken": [20]}
    writes.append(("SADD", "rq:queues", *(f"rq:queue:{name}" for name in queues)))
    for name, offsets in queues.items():
        for number, offset in enumerate(offsets):
            job = f"job-{name}-{number}"
            stamp = _rq_stamp(NOW - offset)
            if name == "broken":
                stamp = "not a time"
            writes.append(
                (
                    "HSET",
                    f"rq:job:{job}",
                    "status",
                    "queued",
                    "origin",
                    name,
                    "enqueued_at",
                    stamp,
                    "created_at",
                    stamp,
                )
            )
            writes.append(("RPUSH", f"rq:queue:{name}", job))
        truth.depths[name, "", "pending"] = len(offsets)  # the queue list; its ready zset reads 0
        if offsets and name != "broken":
            truth.ages[name, "", "pending"] = offsets[0]
        truth.depths[name, "", "active"] = 0  # intermediate and started: some below
        for state in ("scheduled", "failed", "completed"):
            truth.depths[name, "", state] = 0
        truth.due["queue_scheduled_due", name] = 0
    # the started registry: members <job id>:<execution id> scored by deadline, which moves;
    # the longest running is the earliest started_at among them
    started = {"run-a": (90, NOW + 300), "run-b": (400, NOW + 100)}
    for job, (offset, _) in started.items():
        writes.append(
            (
                "HSET",
                f"rq:job:{job}",
                "status",
                "started",
                "origin",
                "default",
                "started_at",
                _rq_stamp(NOW - offset),
            )
        )
    writes.append(
        (
            "ZADD",
            "rq:wip:default",
            *(x for job, (_, deadline) in started.items() for x in (deadline, f"{job}:exec-1")),
        )
    )
    truth.depths["default", "", "active"] = 2
    truth.ages["default", "", "active"] = 400
    writes.append(("ZADD", "rq:scheduled:high", NOW - 1, "job-later-0", NOW + 60, "job-later-1"))
    truth.depths["high", "", "scheduled"] = 2
    truth.due["queue_scheduled_due", "high"] = 1
    writes.append(("ZADD", "rq:failed:default", NOW - 9, "job-failed-0"))
    truth.depths["default", "", "failed"] = 1
    # a finished registry of the wrong type: a failure named, its queue's other series read
    writes.append(("RPUSH", "rq:finished:low", "job-x"))
    del truth.depths["low", "", "completed"]
    truth.errors = {
        "rq:queue:{queue}": {"time_unparsable": 1},
        "rq:finished:{queue}": {"wrong_type": 1},
    }
    return Scenario(
        "rq", "rq", _settings([{"name": "rq", "params": {"native": False}}]), truth, writes
    )


SCENARIOS = {scenario.name: scenario for scenario in (orchestrata(), runnerq(), rq())}
