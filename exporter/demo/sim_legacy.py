"""A legacy app with one Redis list per tenant: the layout that explodes cardinality.

Read by a custom key group (system `legacy`, one queue per tenant). There are more tenants
than the demo's per-metric series cap, so the exporter folds the rest into the overflow series
and counts them (queue_exporter_series_overflow_total). A few tenants' oldest items were
written by an old client as bare ids instead of JSON: the exporter counts each such item as a
read error (queue_exporter_source_errors_total) and goes on.
"""

from __future__ import annotations

import itertools
import json

import redis

from exporter.demo.dice import Dice

PREFIX = "legacy:jobs"
TENANTS = 520
BROKEN_TENANTS = 3
MAX_SERIES_PER_METRIC = 500  # the demo's cap (the default is 10000)

KEY_GROUP = {
    "system": "legacy",
    "pattern": f"{PREFIX}:{{queue}}",
    "type": "list",
    "state": "pending",
    "oldest": {"end": "head", "time_in": "json", "field": "enqueued_at", "format": "epoch_s"},
}


class LegacySim:
    def __init__(self, client: redis.Redis, seed: int) -> None:
        self.client = client
        self.dice = Dice(seed)
        self.tenants = [f"tenant-{number:04d}" for number in range(1, TENANTS + 1)]
        self.lengths = dict.fromkeys(self.tenants, 0)
        self._ids = itertools.count(1)
        self._next = 0.0

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
        if now < self._next:
            return
        self._next = now + 1.0
        pipe = self.client.pipeline(transaction=False)
        for tenant in self.dice.rng.sample(self.tenants, 20):
            pipe.rpush(self._key(tenant), self._item(now))
            self.lengths[tenant] += 1
        for tenant in self.dice.rng.sample(self.tenants[BROKEN_TENANTS:], 20):
            if self.lengths[tenant] > 1:  # never empty: every tenant keeps its series
                pipe.lpop(self._key(tenant))
                self.lengths[tenant] -= 1
        pipe.execute()

    def _item(self, enqueued_at: float) -> str:
        return json.dumps({"id": next(self._ids), "enqueued_at": round(enqueued_at, 3)})

    @staticmethod
    def _key(tenant: str) -> str:
        return f"{PREFIX}:{tenant}"
