"""A Runner-Q queue, written command for command as runner_q_redis writes it.

Priority zset (ZPOPMAX order), processing zset scored by lease deadline, scheduled zset for
delayed activities and retries with exponential backoff, dead-letter list, completed zset,
activity:{uuid} hashes, idempotency keys, and its native `{q}:events_stream` (trimmed to
about 100 entries and expiring after 60 s, as the library does). Workers sometimes die:
their leases expire and the reaper requeues them.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import redis

from exporter.demo import layouts
from exporter.demo.dice import Dice

QUEUE = "default"
TIMEOUT_SECONDS = 15
ACTIVITY_TTL = 7 * 86_400
WORKER_CONCURRENCY = 8
# A worker's poll interval, as an activity's average wait for it: what keeps the priority zset
# holding something at each of the exporter's samples, as a real one does. It holds the last
# POLL_SECONDS' arrivals (Poisson, 90% of --rate): at 20 jobs/s it is empty at a sample with
# odds e^-18 (at 0.5 s, e^-9: over a demo test's 75 to 200 samples, 1 run in 50 to 100).
POLL_SECONDS = 1.0

# What goes wrong on purpose, for the banner.
STAGED_FAULTS = (
    "Runner-Q's sync_crm calls a flaky API (retries); poison activities end dead-lettered",
    "a Runner-Q worker crashes now and then: its leases expire (queue_leases_expired)",
)
COMPLETED_KEEP = 5000
DLQ_KEEP = 1000


@dataclass(frozen=True)
class ActivityType:
    name: str
    share: float
    priorities: tuple[str, ...]
    mean_seconds: float
    failure_rate: float


ACTIVITY_TYPES = (
    ActivityType("send_email", 0.4, ("Normal", "High"), 0.2, 0.03),
    ActivityType("resize_image", 0.25, ("Low", "Normal"), 1.0, 0.04),
    ActivityType("sync_crm", 0.2, ("Normal",), 2.0, 0.15),  # a flaky external API: retries
    ActivityType("charge_subscription", 0.15, ("Critical", "High"), 0.5, 0.03),
)
OUTCOMES = {"retryable": 0.75, "timeout": 0.1, "non_retryable": 0.15}


@dataclass
class Running:
    activity: dict[str, Any]
    kind: ActivityType
    worker: str
    started_at: float
    finish_at: float
    deadline: float
    member: str
    outcome: str


@dataclass
class Worker:
    name: str
    running: list[Running] = field(default_factory=list)


class RunnerQSim:
    def __init__(self, client: redis.Redis, rate: float, seed: int) -> None:
        self.client = client
        self.rate = rate
        self.dice = Dice(seed)
        self.keys = {
            name: f"{QUEUE}:{name}"
            for name in (
                "priority_queue",
                "processing",
                "scheduled_activities",
                "dead_letter_queue",
                "completed_activities",
                "events_stream",
            )
        }
        self.ready: list[tuple[float, int, str, dict[str, Any]]] = []  # (-score, n, member, a)
        # Written to the priority zset, not yet seen by a worker's poll: (since, ready entry)
        self.unpolled: deque[tuple[float, tuple[float, int, str, dict[str, Any]]]] = deque()
        self.scheduled: list[tuple[float, int, dict[str, Any]]] = []
        self.abandoned: list[Running] = []
        self.activity_ids: set[str] = set()  # for removing them from a server not ours
        self._serial = itertools.count(1)
        needed = sum(rate * kind.share * kind.mean_seconds for kind in ACTIVITY_TYPES) * 1.8
        self.workers = [
            self._new_worker() for _ in range(max(1, math.ceil(needed / WORKER_CONCURRENCY)))
        ]
        self._next = {"scheduler": 0.0, "reaper": 0.0, "trim": 0.0}

    def tick(self, now: float, dt: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        for kind in ACTIVITY_TYPES:
            for _ in range(self.dice.poisson(self.rate * kind.share * dt)):
                self._enqueue_new(pipe, kind, now)
        if self.dice.rare("runnerq_worker_crash", 0.002, now, first_after=6.0):
            self._crash()
        self._poll(now)
        for worker in self.workers:
            self._work(pipe, worker, now)
        if now >= self._next["scheduler"]:
            self._process_scheduled(pipe, now)
            self._next["scheduler"] = now + 2.0
        if now >= self._next["reaper"]:
            self._reap(pipe, now)
            self._next["reaper"] = now + 5.0
        if now >= self._next["trim"]:
            pipe.zremrangebyrank(self.keys["completed_activities"], 0, -COMPLETED_KEEP - 1)
            self._next["trim"] = now + 10.0
        pipe.execute()

    # -- enqueue ------------------------------------------------------------------------------

    def _enqueue_new(self, pipe: redis.client.Pipeline, kind: ActivityType, now: float) -> None:
        activity_id = self._new_id()
        priority = self.dice.pick(kind.priorities)
        activity = layouts.runnerq_activity(kind.name, priority, now, activity_id)
        payload = {"seq": next(self._serial)}
        if self.dice.rare("poison_activity", 0.0005, now, first_after=2.0):
            payload["poison"] = 1
        activity.update(timeout_seconds=TIMEOUT_SECONDS, payload=payload)
        if self.dice.chance(0.05):
            key = f"req-{self.dice.rng.getrandbits(32):08x}"
            activity["idempotency_key"] = key
            pipe.set(f"{QUEUE}:idempotency:{key}", activity_id, nx=True, ex=86_400)
        self.activity_ids.add(activity_id)
        hash_key = f"activity:{activity_id}"
        pipe.hset(hash_key, mapping=layouts.runnerq_hash(activity, "Pending"))
        pipe.expire(hash_key, ACTIVITY_TTL)
        if self.dice.chance(0.1):  # execute_at in the future
            due = now + self.dice.rng.uniform(3, 60)
            activity["scheduled_at"] = layouts.rfc3339_nanos(due)
            pipe.hset(hash_key, "scheduled_at", activity["scheduled_at"])
            pipe.zadd(self.keys["scheduled_activities"], {layouts.runnerq_member(activity): due})
            heapq.heappush(self.scheduled, (due, next(self._serial), activity))
            self._event(pipe, activity_id, "Scheduled", now, None, {"scheduled_at": _serde(due)})
            return
        self._make_ready(pipe, activity, now)
        detail = {"priority": priority, "scheduled_at": None}
        self._event(pipe, activity_id, "Enqueued", now, None, detail)

    def _new_id(self) -> str:
        return str(uuid.UUID(int=self.dice.rng.getrandbits(128)))

    def _make_ready(
        self, pipe: redis.client.Pipeline, activity: dict[str, Any], now: float
    ) -> None:
        created = layouts.parse_rfc3339(activity["created_at"])
        score = layouts.runnerq_priority_score(
            activity["priority"], created, now, activity["retry_count"]
        )
        member = layouts.runnerq_member(activity)
        pipe.zadd(self.keys["priority_queue"], {member: score})
        self.unpolled.append((now, (-score, next(self._serial), member, activity)))

    def _poll(self, now: float) -> None:
        """What the workers' polls have seen: an activity waits POLL_SECONDS in the priority
        zset before a worker takes it (so the zset holds the last moments' arrivals)."""
        while self.unpolled and self.unpolled[0][0] <= now - POLL_SECONDS:
            heapq.heappush(self.ready, self.unpolled.popleft()[1])

    # -- workers ------------------------------------------------------------------------------

    def _work(self, pipe: redis.client.Pipeline, worker: Worker, now: float) -> None:
        for run in [run for run in worker.running if run.finish_at <= now]:
            worker.running.remove(run)
            self._finish(pipe, run, now)
        for run in worker.running:
            if run.deadline - now < TIMEOUT_SECONDS / 3:  # long activity: extend the lease
                run.deadline = now + TIMEOUT_SECONDS
                deadline_ms = int(run.deadline * 1000)
                pipe.zadd(self.keys["processing"], {run.member: deadline_ms})
                pipe.hset(f"activity:{run.activity['id']}", "lease_deadline_ms", deadline_ms)
                detail = {"new_deadline_ms": deadline_ms, "extend_by_ms": TIMEOUT_SECONDS * 1000}
                self._event(pipe, run.activity["id"], "LeaseExtended", now, worker.name, detail)
        while len(worker.running) < WORKER_CONCURRENCY and self.ready:
            _, _, member, activity = heapq.heappop(self.ready)  # ZPOPMAX
            self._start(pipe, worker, member, activity, now)

    def _start(
        self,
        pipe: redis.client.Pipeline,
        worker: Worker,
        member: str,
        activity: dict[str, Any],
        now: float,
    ) -> None:
        kind = next(k for k in ACTIVITY_TYPES if k.name == activity["activity_type"])
        outcome = "ok"
        if activity["payload"].get("poison"):  # fails on every attempt: ends dead-lettered
            outcome = "retryable"
        elif self.dice.chance(kind.failure_rate):
            outcome = self.dice.weighted(OUTCOMES)
        took = TIMEOUT_SECONDS if outcome == "timeout" else self.dice.duration(kind.mean_seconds)
        deadline = now + TIMEOUT_SECONDS
        run = Running(activity, kind, worker.name, now, now + took, deadline, member, outcome)
        worker.running.append(run)
        pipe.zrem(self.keys["priority_queue"], member)
        pipe.zadd(self.keys["processing"], {member: int(deadline * 1000)})
        pipe.hset(
            f"activity:{activity['id']}",
            mapping={
                "status": json.dumps("Running"),
                "started_at": layouts.rfc3339_nanos(now),
                "current_worker_id": worker.name,
                "lease_deadline_ms": int(deadline * 1000),
            },
        )
        detail = {"lease_deadline_ms": int(deadline * 1000)}
        self._event(pipe, activity["id"], "Dequeued", now, worker.name, detail)

    def _finish(self, pipe: redis.client.Pipeline, run: Running, now: float) -> None:
        activity, worker = run.activity, run.worker
        outcome = run.outcome
        hash_key = f"activity:{activity['id']}"
        pipe.zrem(self.keys["processing"], run.member)
        finished: dict[Any, Any] = {
            "completed_at": layouts.rfc3339_nanos(now),
            "current_worker_id": "",
        }
        if outcome == "ok":
            pipe.zadd(self.keys["completed_activities"], {activity["id"]: now})
            pipe.hset(hash_key, mapping={**finished, "status": json.dumps("Completed")})
            detail = {"activity_type": activity["activity_type"]}
            self._event(pipe, activity["id"], "Completed", now, worker, detail)
            return
        error = layouts.RUNNERQ_TIMEOUT_ERROR if outcome == "timeout" else _error(outcome)
        if outcome == "non_retryable":
            pipe.zadd(self.keys["completed_activities"], {activity["id"]: now})
            pipe.hset(
                hash_key, mapping={**finished, "status": json.dumps("Failed"), "last_error": error}
            )
            detail = {"retryable": False, "error": error}
            self._event(pipe, activity["id"], "Failed", now, worker, detail)
        elif activity["retry_count"] >= activity["max_retries"]:
            self._dead_letter(pipe, activity, error, now, worker)
        else:
            activity["retry_count"] += 1
            delay = min(activity["retry_delay_seconds"] * 2 ** activity["retry_count"], 3600)
            due = now + delay
            activity["scheduled_at"] = layouts.rfc3339_nanos(due)
            pipe.zadd(self.keys["scheduled_activities"], {layouts.runnerq_member(activity): due})
            pipe.hset(
                hash_key,
                mapping={
                    "status": json.dumps("Retrying"),
                    "retry_count": activity["retry_count"],
                    "scheduled_at": activity["scheduled_at"],
                    "last_error": error,
                    "current_worker_id": "",
                },
            )
            heapq.heappush(self.scheduled, (due, next(self._serial), activity))
            detail = {
                "retry_count": activity["retry_count"],
                "scheduled_at": _serde(due),
                "error": error,
            }
            self._event(pipe, activity["id"], "Retrying", now, worker, detail)

    def _dead_letter(
        self,
        pipe: redis.client.Pipeline,
        activity: dict[str, Any],
        error: str,
        now: float,
        worker: str,
    ) -> None:
        entry = {"activity": activity, "error": error, "failed_at": layouts.rfc3339_nanos(now)}
        pipe.rpush(self.keys["dead_letter_queue"], json.dumps(entry))
        pipe.ltrim(self.keys["dead_letter_queue"], -DLQ_KEEP, -1)
        pipe.zadd(self.keys["completed_activities"], {activity["id"]: now})
        pipe.hset(
            f"activity:{activity['id']}",
            mapping={
                "status": json.dumps("DeadLetter"),
                "completed_at": layouts.rfc3339_nanos(now),
                "last_error": error,
            },
        )
        self._event(pipe, activity["id"], "DeadLetter", now, worker, {"error": error})

    def _crash(self) -> None:
        worker = self.dice.pick([w for w in self.workers if w.running] or self.workers)
        self.abandoned.extend(worker.running)
        self.workers[self.workers.index(worker)] = self._new_worker()

    # -- background loops ---------------------------------------------------------------------

    def _process_scheduled(self, pipe: redis.client.Pipeline, now: float) -> None:
        while self.scheduled and self.scheduled[0][0] <= now:
            due, _, activity = heapq.heappop(self.scheduled)
            pipe.zrem(self.keys["scheduled_activities"], layouts.runnerq_member(activity))
            pipe.hset(f"activity:{activity['id']}", "status", json.dumps("Pending"))
            self._make_ready(pipe, activity, now)
            detail = {
                "priority": activity["priority"],
                "scheduled_at": _serde(due),
                "from": "scheduled",
            }
            self._event(pipe, activity["id"], "Enqueued", now, None, detail)

    def _reap(self, pipe: redis.client.Pipeline, now: float) -> None:
        """Requeue activities whose lease passed (their worker died)."""
        expired = [run for run in self.abandoned if run.deadline <= now]
        self.abandoned = [run for run in self.abandoned if run.deadline > now]
        for run in expired:
            pipe.zrem(self.keys["processing"], run.member)
            pipe.hset(
                f"activity:{run.activity['id']}",
                mapping={"status": json.dumps("Pending"), "current_worker_id": ""},
            )
            self._make_ready(pipe, run.activity, now)
            detail = {"reason": "lease_expired"}
            self._event(pipe, run.activity["id"], "Requeued", now, None, detail)

    # -- helpers ------------------------------------------------------------------------------

    def _new_worker(self) -> Worker:
        return Worker(f"runner-{next(self._serial)}")

    def _event(
        self,
        pipe: redis.client.Pipeline,
        activity_id: str,
        event_type: str,
        now: float,
        worker: str | None,
        detail: dict[str, Any],
    ) -> None:
        stream = self.keys["events_stream"]
        pipe.xadd(stream, layouts.runnerq_event(activity_id, event_type, now, worker, detail))  # type: ignore[arg-type]
        pipe.xtrim(stream, maxlen=100, approximate=True)
        pipe.expire(stream, 60)

    def depth(self) -> int:
        return len(self.ready) + len(self.unpolled)

    def prepare(self, now: float) -> None:
        """What a Runner-Q that ran before the demo left: one activity dead-lettered an hour
        ago (and so completed), so every key group the preset reads has a key from the start."""
        created = now - 3600
        activity = layouts.runnerq_activity("sync_crm", "Normal", created, self._new_id())
        activity.update(timeout_seconds=TIMEOUT_SECONDS, payload={"seq": 0})
        entry = {"activity": activity, "error": _error("non_retryable"),
                 "failed_at": layouts.rfc3339_nanos(created + 5)}  # fmt: skip
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(self.keys["dead_letter_queue"], json.dumps(entry))
        pipe.zadd(self.keys["completed_activities"], {activity["id"]: created + 5})
        pipe.execute()


def _serde(epoch: float) -> str:
    """A chrono DateTime<Utc> as serde writes it in event details."""
    return layouts.rfc3339_nanos(epoch).replace("+00:00", "Z")


def _error(outcome: str) -> str:
    return {"retryable": "connection reset by peer", "non_retryable": "invalid payload"}[outcome]
