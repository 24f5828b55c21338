"""A legacy app: one Redis list per tenant, and instrumentation with a cardinality bug.

Its lists are read by a custom key group (system `legacy`, one queue per tenant). A few
tenants' oldest items were written by an old client as bare ids instead of JSON: the exporter
counts each such item as a read error (queue_exporter_source_errors_total) and goes on.

Its backend_op events name the operation after the key (`GET tenant:0042:config`), one label
set per tenant: when it warms its cache, more than the demo's per-metric series cap. The
exporter keeps the label sets it met first (the seed systems' operations, already seen) and
folds the rest into the overflow series, counted by queue_exporter_series_overflow_total.
"""

from __future__ import annotations

import itertools
import json

import redis

from exporter.demo.dice import Dice
from exporter.lifecycle.producer import EventEmitter

PREFIX = "legacy:jobs"
TENANTS = 260
QUEUED_TENANTS = 40  # the tenants with background jobs, each with its list
BROKEN_TENANTS = 3
WARM_UP_AFTER = 8.0  # seconds: the app restarts and reads every tenant's configuration
MAX_SERIES_PER_METRIC = 2000  # the demo's cap in samples per metric (the default is 10000)

# What goes wrong on purpose, for the banner.
STAGED_FAULTS = (
    f"{BROKEN_TENANTS} legacy tenants' oldest items are bare ids, not JSON: a WARNING "
    "[item_not_json] and queue_exporter_source_errors_total, their age not read",
    "the legacy app names operations after keys: past the series cap they fold into the "
    "overflow series (queue_exporter_series_overflow_total, QueueExporterSeriesOverflow)",
)

KEY_GROUP = {
    "system": "legacy",
    "pattern": f"{PREFIX}:{{queue}}",
    "type": "list",
    "state": "pending",
    "oldest": {"end": "head", "time_in": "json", "field": "enqueued_at", "format": "epoch_s"},
}


class LegacySim:
    def __init__(self, client: redis.Redis, emitter: EventEmitter, seed: int) -> None:
        self.client = client
        self.emitter = emitter
        self.dice = Dice(seed)
        self.all_tenants = [f"tenant-{number:04d}" for number in range(1, TENANTS + 1)]
        self.tenants = self.all_tenants[:QUEUED_TENANTS]
        self.lengths = dict.fromkeys(self.tenants, 0)
        self._ids = itertools.count(1)
        self._next = 0.0
        self._warmed = False

    def prepare(self, now: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        for index, tenant in enumerate(self.tenants):
            if index < BROKEN_TENANTS:  # written by the old client: a bare id, not JSON
                pipe.rpush(self._key(tenant), f"job:{next(self._ids)}")
                self.lengths[tenant] += 1
            for _ in range(self.dice.rng.randint(1, 3)):
                pipe.rpush(self._key(tenant), self._item(now - self.dice.rng.uniform(0, 300)))
                self.lengths[tenant] += 1
        pipe.execute()

    def tick(self, now: float, dt: float) -> None:
        if not self._warmed and now - self.dice.started >= WARM_UP_AFTER:
            self._warmed = True
            for tenant in self.all_tenants:
                self._config_read(tenant)
        if now < self._next:
            return
        self._next = now + 1.0
        for tenant in self.dice.rng.sample(self.all_tenants, 5):
            self._config_read(tenant)
        pipe = self.client.pipeline(transaction=False)
        for tenant in self.dice.rng.sample(self.tenants, 20):
            pipe.rpush(self._key(tenant), self._item(now))
            self.lengths[tenant] += 1
        for tenant in self.dice.rng.sample(self.tenants[BROKEN_TENANTS:], 20):
            if self.lengths[tenant] > 1:  # never empty: every tenant keeps its series
                pipe.lpop(self._key(tenant))
                self.lengths[tenant] -= 1
        pipe.execute()

    def _config_read(self, tenant: str) -> None:
        took = self.dice.duration(0.0004)
        operation = f"GET {tenant.replace('-', ':')}:config"  # the bug: a key as a label
        self.emitter.emit(
            "backend_op", system="legacy", queue="config-cache", operation=operation, duration=took
        )

    def _item(self, enqueued_at: float) -> str:
        return json.dumps({"id": next(self._ids), "enqueued_at": round(enqueued_at, 3)})

    @staticmethod
    def _key(tenant: str) -> str:
        return f"{PREFIX}:{tenant}"
