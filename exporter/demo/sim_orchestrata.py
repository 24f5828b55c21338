"""Orchestrata kernel recipients, instrumented with the producer library.

The lists, dead-letter lists and message metadata are written as the kernel writes them
(layouts.py); what the kernel keeps only in its process (in-flight jobs, failures, workers)
reaches the exporter as v1 lifecycle events through exporter.lifecycle.producer. The `reports`
recipient is under-provisioned on purpose: its backlog climbs towards the backpressure limit.
"""

from __future__ import annotations

import heapq
import itertools
import math
import uuid
from collections import deque
from dataclasses import dataclass, field

import redis

from exporter.demo import layouts
from exporter.demo.dice import Dice
from exporter.lifecycle import wire
from exporter.lifecycle.producer import EventEmitter

PREFIX = "orchestrata"
EVENTS_STREAM = f"{PREFIX}:events"
MAX_DEPTH = 500  # the demo's backpressure limit (the kernel's default is 10000)
MAX_ATTEMPTS = 3
LEASE_SECONDS = 10.0
DLQ_KEEP = 1000
ERROR_TYPES = {
    "retryable": 0.5,
    "timeout": 0.2,
    "non_retryable": 0.15,
    "handler_not_found": 0.05,
    "other": 0.1,
}
FINAL = frozenset({"non_retryable", "handler_not_found"})


@dataclass(frozen=True)
class Recipient:
    name: str
    share: float  # of the enqueue rate
    job_types: tuple[str, ...]
    priorities: tuple[int, ...]  # 0 lowest .. 5 critical
    mean_seconds: float
    failure_rate: float
    headroom: float  # worker slots over the slots the mean load needs


RECIPIENTS = (
    Recipient("billing", 0.25, ("charge_card", "send_invoice"), (5, 4), 0.3, 0.04, 2.5),
    Recipient("notifications", 0.4, ("send_email", "send_push"), (3, 2, 1), 0.15, 0.03, 2.5),
    Recipient("search-indexer", 0.2, ("index_document",), (1, 0), 0.6, 0.05, 2.0),
    Recipient("reports", 0.15, ("build_report",), (2,), 4.0, 0.08, 0.8),
)
WORKER_CAPACITY = 4
# The under-provisioned recipient's backlog when the demo starts (its workers never catch up).
STARTING_BACKLOG = 60

# What goes wrong on purpose, for the banner: what a newcomer sees warned about or alerting.
STAGED_FAULTS = (
    "Orchestrata's reports recipient is under-provisioned: its backlog climbs to the "
    "backpressure limit (QueueNearCapacity, QueueBacklogGrowing)",
    "an old Orchestrata producer sends an event without ts: refused and counted in "
    "queue_exporter_events_invalid_total (a WARNING 'refused entry ... missing_field')",
    "poison messages fail every attempt and are dead-lettered (QueueDeadLetterGrowing)",
    "Orchestrata workers crash now and then: their leases expire, the reaper requeues the jobs",
)


@dataclass
class Job:
    message_id: str
    recipient: str
    job_type: str
    priority: int
    queued_at: float
    ready_at: float
    attempt: int = 1
    started_at: float = 0.0
    finish_at: float = 0.0
    next_extend: float = 0.0
    poison: bool = False  # fails on every attempt, until it is dead-lettered


@dataclass
class Worker:
    name: str
    recipient: Recipient
    jobs: list[Job] = field(default_factory=list)
    last_empty: float = 0.0


class OrchestrataSim:
    def __init__(self, client: redis.Redis, emitter: EventEmitter, rate: float, seed: int) -> None:
        self.client = client
        self.emitter = emitter
        self.rate = rate
        self.dice = Dice(seed)
        self.queues: dict[tuple[str, int], deque[Job]] = {
            (r.name, p): deque() for r in RECIPIENTS for p in r.priorities
        }
        self.workers: list[Worker] = []
        self._serial = itertools.count(1)
        for recipient in RECIPIENTS:
            slots = rate * recipient.share * recipient.mean_seconds * recipient.headroom
            for _ in range(max(1, math.ceil(slots / WORKER_CAPACITY))):
                self.workers.append(self._new_worker(recipient))
        self.delayed: list[tuple[float, int, Job]] = []  # retries and scheduled jobs, by due time
        self.abandoned: list[Job] = []  # held by crashed workers until their lease runs out
        self.refused = 0
        self._burst: tuple[str, float] = ("", 0.0)
        self._next_burst = self.dice.started + 10.0
        self._next = {"heartbeat": 0.0, "scheduler": 0.0, "reaper": 0.0, "snapshot": 0.0}

    # -- one tick -----------------------------------------------------------------------------

    def tick(self, now: float, dt: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        self._bursts(now)
        for recipient in RECIPIENTS:
            factor = 8.0 if self._burst[0] == recipient.name and now < self._burst[1] else 1.0
            for _ in range(self.dice.poisson(self.rate * recipient.share * factor * dt)):
                self._arrive(pipe, recipient, now)
        self._crashes(now)
        for worker in self.workers:
            self._work(pipe, worker, now)
        self._periodic(pipe, now)
        if self.dice.rare("invalid_event", 0.0005, now, first_after=3.0):
            # An old producer build that sends no ts: counted as invalid, never applied.
            pipe.xadd(EVENTS_STREAM, {"v": "1", "event": "completed", "queue": "billing"})
        pipe.execute()

    def _bursts(self, now: float) -> None:
        if now >= self._next_burst:
            recipient = self.dice.pick(RECIPIENTS)
            self._burst = (recipient.name, now + self.dice.rng.uniform(5, 10))
            self._next_burst = now + self.dice.rng.uniform(40, 90)

    # -- producers ----------------------------------------------------------------------------

    def _arrive(self, pipe: redis.client.Pipeline, recipient: Recipient, now: float) -> None:
        job = Job(
            message_id=str(uuid.UUID(int=self.dice.rng.getrandbits(128))),
            recipient=recipient.name,
            job_type=self.dice.pick(recipient.job_types),
            priority=self.dice.pick(recipient.priorities),
            queued_at=now,
            ready_at=now,
            poison=self.dice.rare("poison_message", 0.0005, now, first_after=2.0),
        )
        if self.dice.chance(0.08) and not self._idempotency_check(job):
            return
        if self.dice.chance(0.05):  # send_at in the future: held by the kernel's scheduler
            delay = self.dice.rng.uniform(5, 120)
            job.ready_at = now + delay
            self._emit("scheduled", job, delay=delay, scheduled_for=job.ready_at)
            heapq.heappush(self.delayed, (job.ready_at, next(self._serial), job))
            return
        self._enqueue(pipe, job, now)

    def _idempotency_check(self, job: Job) -> bool:
        """An enqueue with an idempotency key: False when it must not be enqueued."""
        outcome = self.dice.weighted({"new": 0.7, "reused": 0.2, "conflict": 0.1})
        took = self.dice.duration(0.0008)
        if outcome == "reused":
            self._emit("idempotency_reused", job, duration=took)
        elif outcome == "conflict":
            self._emit("idempotency_conflict", job, duration=took)
        return outcome == "new"

    def _enqueue(self, pipe: redis.client.Pipeline, job: Job, now: float) -> None:
        depth = sum(len(self.queues[(job.recipient, p)]) for p in self._priorities(job.recipient))
        if depth >= MAX_DEPTH:  # the kernel refuses: backpressure
            self.refused += 1
            return
        key = f"{PREFIX}:queue:{job.recipient}:p{job.priority}"
        packet = {"type": job.job_type, "attempt": job.attempt}
        message = layouts.orchestrata_message(
            job.recipient, job.priority, job.queued_at, packet, job.message_id
        )
        pipe.rpush(key, message)
        pipe.expire(key, layouts.ORCHESTRATA_MESSAGE_TTL)
        meta = f"{PREFIX}:msg_meta:{job.message_id}"
        pipe.hset(
            meta,
            mapping={
                "recipient": job.recipient,
                "priority": job.priority,
                "queued_at": layouts.iso(job.queued_at),
                "status": "queued",
            },
        )
        pipe.expire(meta, layouts.ORCHESTRATA_MESSAGE_TTL)
        self.queues[(job.recipient, job.priority)].append(job)
        if job.attempt == 1:
            self._emit("enqueued", job)
        self._emit("backend_op", job, operation="enqueue", duration=self.dice.duration(0.0006))

    # -- workers ------------------------------------------------------------------------------

    def _work(self, pipe: redis.client.Pipeline, worker: Worker, now: float) -> None:
        for job in [job for job in worker.jobs if job.finish_at <= now]:
            worker.jobs.remove(job)
            self._finish(pipe, worker, job, now)
        for job in worker.jobs:
            if now >= job.next_extend:  # long jobs keep their lease alive
                self._emit("lease_extended", job, worker=worker.name)
                job.next_extend = now + LEASE_SECONDS / 2
        while len(worker.jobs) < WORKER_CAPACITY:
            if self.dice.rare("dequeue_error", 0.0005, now, first_after=5.0):
                self._emit_queue("dequeue_error", worker.recipient.name, worker=worker.name)
                break
            taken = self._dequeue(pipe, worker.recipient, now)
            if taken is None:
                if now - worker.last_empty >= 1.0:  # an idle worker polls about once a second
                    self._emit_queue("dequeue_empty", worker.recipient.name, worker=worker.name)
                    worker.last_empty = now
                break
            self._start(pipe, worker, taken, now)

    def _dequeue(self, pipe: redis.client.Pipeline, recipient: Recipient, now: float) -> Job | None:
        for priority in sorted(recipient.priorities, reverse=True):  # most urgent first
            queue = self.queues[(recipient.name, priority)]
            if queue:
                pipe.lpop(f"{PREFIX}:queue:{recipient.name}:p{priority}")
                return queue.popleft()
        return None

    def _start(self, pipe: redis.client.Pipeline, worker: Worker, job: Job, now: float) -> None:
        pipe.hset(
            f"{PREFIX}:msg_meta:{job.message_id}",
            mapping={"status": "dequeued", "dequeued_at": layouts.iso(now)},
        )
        job.started_at = now
        job.finish_at = now + self.dice.duration(worker.recipient.mean_seconds)
        job.next_extend = now + LEASE_SECONDS / 2
        worker.jobs.append(job)
        fields: dict[str, wire.FieldValue] = {"worker": worker.name, "attempt": job.attempt}
        self._emit("dequeued", job, **fields)
        self._emit("backend_op", job, operation="dequeue", duration=self.dice.duration(0.0009))
        self._emit("started", job, enqueued_at=job.ready_at, **fields)

    def _finish(self, pipe: redis.client.Pipeline, worker: Worker, job: Job, now: float) -> None:
        timing: dict[str, wire.FieldValue] = {
            "worker": worker.name,
            "attempt": job.attempt,
            "duration": now - job.started_at,
            "enqueued_at": job.queued_at,
        }
        if not job.poison and not self.dice.chance(worker.recipient.failure_rate):
            self._emit("completed", job, **timing)
            pipe.delete(f"{PREFIX}:msg_meta:{job.message_id}")
            return
        error_type = "retryable" if job.poison else self.dice.weighted(ERROR_TYPES)
        self._emit("failed", job, error_type=error_type, **timing)
        if error_type == "timeout":
            self._emit("timed_out", job, worker=worker.name, attempt=job.attempt)
        if error_type in FINAL:
            self._dead_letter(pipe, job, now, error_type)
        elif job.attempt >= MAX_ATTEMPTS:
            self._emit("max_retries_exceeded", job, attempt=job.attempt)
            self._dead_letter(pipe, job, now, f"{error_type} after {job.attempt} attempts")
        else:
            delay = 2.0**job.attempt + self.dice.rng.uniform(0, 1)
            self._emit("retried", job, delay=delay, attempt=job.attempt)
            job.attempt += 1
            job.ready_at = now + delay
            heapq.heappush(self.delayed, (job.ready_at, next(self._serial), job))

    def _dead_letter(self, pipe: redis.client.Pipeline, job: Job, now: float, reason: str) -> None:
        key = f"{PREFIX}:dlq:{job.recipient}"
        metadata = {"job_type": job.job_type, "attempts": job.attempt}
        pipe.rpush(
            key,
            layouts.orchestrata_dead_letter(job.recipient, job.message_id, now, reason, metadata),
        )
        pipe.ltrim(key, -DLQ_KEEP, -1)
        pipe.expire(key, layouts.ORCHESTRATA_DLQ_TTL)
        pipe.hset(
            f"{PREFIX}:msg_meta:{job.message_id}",
            mapping={
                "status": "dead_letter",
                "failed_at": layouts.iso(now),
                "failure_reason": reason,
            },
        )
        self._emit("dead_lettered", job, attempt=job.attempt)

    def _crashes(self, now: float) -> None:
        """Now and then a worker dies: its jobs wait for their lease to run out, then the
        reaper requeues them; its heartbeats stop, so it leaves the worker gauges."""
        if not self.dice.rare("worker_crash", 0.002, now, first_after=4.0):
            return
        busy = [worker for worker in self.workers if worker.jobs] or self.workers
        worker = self.dice.pick(busy)
        for job in worker.jobs:
            job.finish_at = job.started_at + LEASE_SECONDS  # the lease deadline
            self.abandoned.append(job)
        self.workers[self.workers.index(worker)] = self._new_worker(worker.recipient)

    # -- the kernel's periodic loops ----------------------------------------------------------

    def _periodic(self, pipe: redis.client.Pipeline, now: float) -> None:
        due = self._next
        if now >= due["heartbeat"]:
            for worker in self.workers:
                self.emitter.heartbeat(
                    worker.name, worker.recipient.name, len(worker.jobs), WORKER_CAPACITY
                )
            due["heartbeat"] = now + 2.0
        if now >= due["scheduler"]:
            self._scheduler_cycle(pipe, now)
            due["scheduler"] = now + 1.0
        if now >= due["reaper"]:
            self._reaper_cycle(pipe, now)
            due["reaper"] = now + 5.0
        if now >= due["snapshot"]:
            for recipient in RECIPIENTS:
                took = self.dice.duration(0.004)
                self._emit_queue(
                    "backend_op", recipient.name, operation="snapshot_write", duration=took
                )
            due["snapshot"] = now + 5.0

    def _scheduler_cycle(self, pipe: redis.client.Pipeline, now: float) -> None:
        moved: dict[str, int] = {r.name: 0 for r in RECIPIENTS}
        while self.delayed and self.delayed[0][0] <= now:
            _, _, job = heapq.heappop(self.delayed)
            self._enqueue(pipe, job, now)
            moved[job.recipient] += 1
        for recipient, count in moved.items():
            ok = not self.dice.rare("scheduler_error", 0.002, now, first_after=4.0)
            took = self.dice.duration(0.002)
            self._emit_queue("scheduler_cycle", recipient, duration=took, count=count, ok=ok)

    def _reaper_cycle(self, pipe: redis.client.Pipeline, now: float) -> None:
        expired = [job for job in self.abandoned if job.finish_at <= now]
        self.abandoned = [job for job in self.abandoned if job.finish_at > now]
        requeued: dict[str, int] = {r.name: 0 for r in RECIPIENTS}
        for job in expired:
            self._emit("requeued", job, reason="lease_expired", attempt=job.attempt)
            key = f"{PREFIX}:queue:{job.recipient}:p{job.priority}"
            message = layouts.orchestrata_message(
                job.recipient, job.priority, job.queued_at, {"type": job.job_type}, job.message_id
            )
            pipe.lpush(key, message)  # back at the head: served next
            self.queues[(job.recipient, job.priority)].appendleft(job)
            requeued[job.recipient] += 1
        for recipient, count in requeued.items():
            ok = not self.dice.rare("reaper_error", 0.002, now, first_after=6.0)
            took = self.dice.duration(0.003)
            self._emit_queue("reaper_cycle", recipient, duration=took, count=count, ok=ok)

    # -- helpers ------------------------------------------------------------------------------

    def _new_worker(self, recipient: Recipient) -> Worker:
        return Worker(f"{recipient.name}-worker-{next(self._serial)}", recipient)

    def _priorities(self, recipient: str) -> tuple[int, ...]:
        return next(r.priorities for r in RECIPIENTS if r.name == recipient)

    def _emit(self, event: str, job: Job, **fields: wire.FieldValue) -> None:
        self.emitter.emit(
            event,
            queue=job.recipient,
            job_type=job.job_type,
            priority=str(job.priority),
            job_id=job.message_id,
            **fields,
        )

    def _emit_queue(self, event: str, queue: str, **fields: wire.FieldValue) -> None:
        self.emitter.emit(event, queue=queue, **fields)

    def depth(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def prepare(self, now: float) -> None:
        """What a kernel that ran before the demo left: the under-provisioned recipient's
        backlog of the last minute and one dead letter of an hour ago, so every key group the
        preset reads has a key from the start."""
        pipe = self.client.pipeline(transaction=False)
        slow = min(RECIPIENTS, key=lambda recipient: recipient.headroom)
        for index in range(STARTING_BACKLOG):
            queued_at = now - 60 + index * 60 / STARTING_BACKLOG
            job = Job(
                message_id=str(uuid.UUID(int=self.dice.rng.getrandbits(128))),
                recipient=slow.name,
                job_type=self.dice.pick(slow.job_types),
                priority=self.dice.pick(slow.priorities),
                queued_at=queued_at,
                ready_at=queued_at,
            )
            self._enqueue(pipe, job, queued_at)
        pipe.execute()
        recipient = RECIPIENTS[0]
        message_id = str(uuid.UUID(int=self.dice.rng.getrandbits(128)))
        key = f"{PREFIX}:dlq:{recipient.name}"
        metadata = {"job_type": recipient.job_types[0], "attempts": MAX_ATTEMPTS}
        letter = layouts.orchestrata_dead_letter(
            recipient.name, message_id, now - 3600, "max attempts exceeded", metadata
        )
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(key, letter)
        pipe.expire(key, layouts.ORCHESTRATA_DLQ_TTL)
        pipe.execute()
