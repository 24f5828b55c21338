"""Celery's broadcast inspection over Redis, as `celery inspect` sends it: one round a read.

Celery's remote control is kombu's pidbox: a command is a kombu message PUBLISHed on the
`celery.pidbox` fanout exchange (`/<db>.celery.pidbox` on the Redis transport), every worker
answers into the reply queue the message names, a list the asker binds in the
`reply.celery.pidbox` exchange (a member of `_kombu.binding.reply.celery.pidbox`). A round
sends `stats` (the pool's max-concurrency: a worker's slots), `active_queues` (the queues it
consumes), `active` and `reserved` (the tasks it runs and holds, each with its routing key),
and `conf` to workers whose configuration it has not read yet (`task_routes` and
`task_default_queue`: where Celery routes each task name), then takes replies until every
worker it knows has answered or its deadline passes,
and unbinds and deletes its reply queue: what `celery inspect` leaves in Redis, it leaves too.

These are writes (SADD/SREM of the binding, ZADD of kombu's binding deadline so that kombu's
sweep keeps the table while the round runs, PUBLISH, BRPOP and DEL of the reply list): the
`inspect: false` setting of the Celery reader sends none, for a read-only deployment.
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
import uuid
from base64 import b64decode, b64encode
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from exporter.core.numbers import InvalidValue
from exporter.sources.readers.config import (
    INSPECT_BINDINGS,
    INSPECT_DEADLINES,
    INSPECT_REPLY_EXCHANGE,
)

METHODS = ("stats", "active_queues", "active", "reserved")
CONF = "conf"
REPLY_EXCHANGE = INSPECT_REPLY_EXCHANGE
BINDINGS = INSPECT_BINDINGS
# kombu 5.7 sweeps a binding table whose deadline passed; the reply queue's own TTL, as kombu
# sets it for `celery inspect` (reply_queue_expires 10 s x its factor: an hour).
BINDING_DEADLINES = INSPECT_DEADLINES
BINDING_TTL_MS = 3_600_000
MAX_REPLY_BYTES = 4 << 20  # a worker's `reserved` of thousands of prefetched tasks fits
MAX_TASKS_PER_WORKER = 10_000
MAX_ROUTES = 10_000  # task_routes entries per map read
POLL = 0.05  # seconds a BRPOP waits at most: the round checks its deadline between them


@dataclass(frozen=True, slots=True)
class HeldTask:
    """A task a worker runs (`active`) or holds prefetched (`reserved`), with its queue."""

    task_id: str
    name: str
    queue: str
    started_at: float | None  # `active`: when it started (the worker's clock)


@dataclass(slots=True)
class WorkerReport:
    """What one worker answered in a round (None: it did not answer that command)."""

    slots: int | None = None
    queues: list[str] | None = None
    running: list[HeldTask] | None = None
    reserved: list[HeldTask] | None = None
    routes: Routes | None = None  # its `conf`: None when not asked, or routes not plain data
    answered: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Routes:
    """A worker's `task_routes` as Celery's MapRoute reads them, when they are plain data (a
    dict, or a list of dicts: names and globs to a queue), and its `task_default_queue`."""

    maps: list[tuple[dict[str, str], list[tuple[re.Pattern[str], str]]]]  # (names, globs)
    default_queue: str

    def queue_of(self, name: str) -> str:
        """The queue Celery routes task `name` to (the caller's own `queue=` and a task's
        own `queue` attribute aside): the first map that routes it, else the default."""
        for exact, globs in self.maps:
            if name in exact:
                return exact[name]
            for pattern, queue in globs:
                if pattern.match(name):
                    return queue
        return self.default_queue


class Inspector:
    """Sends rounds from one reply queue of its own (`<oid>.reply.celery.pidbox`)."""

    def __init__(self, channel: str, sep: str) -> None:
        """`channel`: kombu's /<db>.celery.pidbox; `sep`: the transport's separator, which
        workers split the binding's member by."""
        self.oid = str(uuid.uuid4())
        self.reply_queue = f"{self.oid}.{REPLY_EXCHANGE}"
        self.channel = channel
        self._member = sep.join((self.oid, "", self.reply_queue))  # routing key, pattern, queue

    def round(
        self,
        client: redis.Redis,
        timeout: float,
        expected: set[str],
        refuse: Callable[[str, Exception], None],
        conf_for: list[str] | None = None,
    ) -> dict[str, WorkerReport]:
        """One round: every worker's answers within `timeout` seconds, or sooner once each of
        `expected` (the workers known) answered. `conf` goes to the workers `conf_for` names
        (None: every worker; []: none). `refuse(what, error)` counts a reply that is not
        Celery's (it costs itself alone)."""
        deadline = time.monotonic() + timeout
        tickets = {str(uuid.uuid4()): method for method in METHODS}
        destinations: dict[str, list[str] | None] = {}
        if conf_for is None or conf_for:
            ticket = str(uuid.uuid4())
            tickets[ticket], destinations[ticket] = CONF, conf_for
        pipe = client.pipeline(transaction=True)
        pipe.delete(self.reply_queue)  # a late answer of the previous round
        pipe.sadd(BINDINGS, self._member)
        pipe.zadd(BINDING_DEADLINES, {REPLY_EXCHANGE: _now_ms() + BINDING_TTL_MS}, gt=True)
        pipe.execute()
        reports: dict[str, WorkerReport] = {}
        try:
            for ticket, method in tickets.items():
                destination = destinations.get(ticket)
                client.publish(self.channel, self._command(method, ticket, timeout, destination))
            asked = {
                host: {*METHODS, *([CONF] if conf_for is None or host in conf_for else [])}
                for host in expected
            }
            while time.monotonic() < deadline and not _all_answered(reports, asked):
                popped = client.brpop([self.reply_queue], timeout=POLL)
                if popped is not None:
                    try:
                        _take(popped[1], tickets, reports)
                    except Exception as error:  # a reply not Celery's costs itself alone
                        refuse(self.reply_queue, error)
        finally:
            self.leave(client)
        return reports

    def leave(self, client: redis.Redis) -> None:
        """Unbind and delete the reply queue, as kombu does after each collect."""
        pipe = client.pipeline(transaction=True)
        pipe.srem(BINDINGS, self._member)
        pipe.delete(self.reply_queue)
        pipe.execute()

    def _command(
        self, method: str, ticket: str, timeout: float, destination: list[str] | None = None
    ) -> str:
        body = {
            "method": method,
            "arguments": {},
            "destination": destination,
            "pattern": None,
            "matcher": None,
            "ticket": ticket,
            "reply_to": {"exchange": REPLY_EXCHANGE, "routing_key": self.oid},
        }
        return json.dumps(
            {
                "body": b64encode(json.dumps(body).encode()).decode(),
                "content-encoding": "utf-8",
                "content-type": "application/json",
                # past `expires` a worker drops the command (a round that ended long ago)
                "headers": {"clock": 0, "expires": time.time() + timeout},
                "properties": {
                    "delivery_mode": 2,
                    "delivery_info": {"exchange": "celery.pidbox", "routing_key": ""},
                    "priority": 0,
                    "body_encoding": "base64",
                    "delivery_tag": str(uuid.uuid4()),
                },
            }
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _all_answered(reports: dict[str, WorkerReport], asked: dict[str, set[str]]) -> bool:
    if not asked:
        return False  # nobody known: the whole round listens
    return all(name in reports and reports[name].answered >= want for name, want in asked.items())


def _take(raw: bytes | str, tickets: dict[str, str], reports: dict[str, WorkerReport]) -> None:
    """One reply: `{hostname: answer}` in a kombu envelope whose ticket names the command."""
    if len(raw) > MAX_REPLY_BYTES:
        raise InvalidValue("oversized_field", f"a reply of {len(raw)} bytes")
    envelope = json.loads(raw)
    method = tickets.get(str((envelope.get("headers") or {}).get("ticket")))
    if method is None:
        return  # an answer to another round (or another asker's): not this round's
    body = envelope["body"]
    if (envelope.get("properties") or {}).get("body_encoding") == "base64":
        body = b64decode(body)
    answers = json.loads(body)
    if not isinstance(answers, dict):
        raise InvalidValue("bad_value", "a reply that is no JSON object")
    for hostname, answer in answers.items():
        report = reports.setdefault(str(hostname), WorkerReport())
        report.answered.add(method)
        if isinstance(answer, dict) and "error" in answer:
            continue  # a command this worker does not know: that figure stays unknown
        _apply(method, answer, report)


def _apply(method: str, answer: Any, report: WorkerReport) -> None:
    if method == "stats":
        slots = (answer.get("pool") or {}).get("max-concurrency")
        if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 0:
            report.slots = slots
    elif method == "active_queues":
        report.queues = [str(queue["name"]) for queue in answer[:MAX_TASKS_PER_WORKER]]
    elif method == "active":
        report.running = [_held(task) for task in answer[:MAX_TASKS_PER_WORKER]]
    elif method == "reserved":
        report.reserved = [_held(task) for task in answer[:MAX_TASKS_PER_WORKER]]
    elif method == CONF:
        report.routes = _routes(answer)


def _routes(conf: dict[str, Any]) -> Routes | None:
    """`task_routes` as plain data, read as Celery's MapRoute does; None when a router is a
    function or a class (the reply holds its repr): then no name's queue can be told."""
    default = conf.get("task_default_queue") or "celery"
    routes = conf.get("task_routes") or {}
    maps = routes if isinstance(routes, list) else [routes]
    if not isinstance(default, str) or not all(isinstance(entry, dict) for entry in maps):
        return None
    read = []
    for entry in maps:
        exact: dict[str, str] = {}
        globs: list[tuple[re.Pattern[str], str]] = []
        for key, route in list(entry.items())[:MAX_ROUTES]:
            queue = route.get("queue") if isinstance(route, dict) else route
            if not isinstance(queue, str) or not isinstance(key, str):
                return None  # a route by exchange alone, or not a name: not told
            if "*" in key:
                globs.append((re.compile(fnmatch.translate(key)), queue))
            else:
                exact[key] = queue
        read.append((exact, globs))
    return Routes(read, default)


def _held(task: dict[str, Any]) -> HeldTask:
    delivery = task.get("delivery_info") or {}
    started = task.get("time_start")
    return HeldTask(
        task_id=str(task["id"]),
        name=str(task.get("name") or ""),
        queue=str(delivery.get("routing_key") or ""),
        started_at=float(started) if isinstance(started, int | float) else None,
    )
