"""Seeded randomness for the workload, and rare incidents that surely happen once early.

A demo must show every metric family within seconds, yet a dead letter or a failed reaper
cycle is rare by nature: `rare()` fires the first opportunity after `first_after` seconds,
then with its probability.
"""

from __future__ import annotations

import math
import random
import time
from typing import TypeVar

T = TypeVar("T")


class Dice:
    def __init__(self, seed: int, clock: float | None = None) -> None:
        self.rng = random.Random(seed)
        self.started = time.time() if clock is None else clock
        self._happened: set[str] = set()

    def chance(self, probability: float) -> bool:
        return self.rng.random() < probability

    def rare(self, name: str, probability: float, now: float, first_after: float = 3.0) -> bool:
        if name not in self._happened and now - self.started >= first_after:
            self._happened.add(name)
            return True
        return self.rng.random() < probability

    def poisson(self, mean: float) -> int:
        """Arrivals in one tick (Knuth's method: means here are small)."""
        if mean <= 0:
            return 0
        if mean > 30:
            return max(0, round(self.rng.gauss(mean, math.sqrt(mean))))
        limit, count, product = math.exp(-mean), 0, self.rng.random()
        while product > limit:
            count += 1
            product *= self.rng.random()
        return count

    def duration(self, mean: float) -> float:
        """A job's run time: log-normal around `mean`, with the long tail real handlers have."""
        sigma = 0.6
        return self.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)

    def pick(self, options: tuple[T, ...] | list[T]) -> T:
        return self.rng.choice(options)

    def weighted(self, weights: dict[str, float]) -> str:
        return self.rng.choices(list(weights), list(weights.values()))[0]
