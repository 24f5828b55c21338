"""The one set of checks every queue system's conformance run goes through (issue 39).

An adapter (tests/conformance/adapters/) drives the real library and its workers and turns what
the library's own API says into a `Truth`: depth per queue and state (the adapter's state map),
the jobs due, the ages of the oldest waiting and longest running jobs, counters, workers and the
sources that must be up. `mismatches()` compares a scrape with it, check by check, each check
named by a key ("depth emails pending", "age slow active", "queues", ...).

A check that cannot pass today because of a gap issue 39 names is a `Gap` of the adapter: what
is served instead (`today`) is asserted exactly, and a gap whose check starts passing is itself
a mismatch, so a gap neither hides a regression nor outlives its fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exporter.output.catalog import SIGNALS
from tests.conftest import Series, value

State = tuple[str, str]  # (queue, state)
# (queue, state), or (queue, state, priority) for a state split by priority (PriorityRedisHuey)
Where = tuple[str, ...]


@dataclass(frozen=True)
class Age:
    """The age of a job that began (was enqueued, started) between `since_earliest` and
    `since_latest` (epoch seconds); served between the truth and the scrape, so between the
    ages at those two moments, `below` and `above` seconds of slack."""

    since_earliest: float
    since_latest: float
    below: float = 0.5
    above: float = 0.5

    @classmethod
    def at(cls, since: float, below: float = 0.5, above: float = 0.5) -> Age:
        return cls(since, since, below, above)

    def window(self, taken_at: float, scraped_at: float) -> tuple[float, float]:
        early, late = min(taken_at, scraped_at), max(taken_at, scraped_at)
        return early - self.since_latest - self.below, late - self.since_earliest + self.above


@dataclass(frozen=True)
class ReadAge:
    """An age read by `source` (a collector on its own interval): the time since `since` at a
    moment between the source's success before the one served and that one
    (queue_exporter_source_last_success_timestamp_seconds); `ReadTimes` keeps them."""

    since: float
    source: str


@dataclass(frozen=True)
class Gap:
    """A check that fails today for a reason issue 39 names (`point`); `today` is what is
    served instead (None: nothing). `key` names a check, or all checks under it ("depth work"
    covers "depth work pending", "depth work scheduled", ...). `variant`: the run it applies to."""

    key: str
    point: str
    today: object = None
    variant: str = "defaults"

    def covers(self, key: str) -> bool:
        return key == self.key or key.startswith(self.key + " ")


@dataclass
class Truth:
    """What the library says, mapped to the exporter's metrics. Checks with no entry here are
    not run: a system that does not record something has no entry for it."""

    system: str
    taken_at: float  # epoch seconds when the library was read
    depths: dict[Where, float] | None  # None: a phase that checks no depth
    # every (queue, state) served must be in depths; else only the queues must be the same
    exact_states: bool = False
    due: dict[str, float] = field(default_factory=dict)
    exact_due: bool = False  # no due count served for a queue not in due
    ages: dict[Where, Age | ReadAge | None] = field(default_factory=dict)  # None: no age served
    exact_ages: bool = False  # no age served for a (queue, state) not in ages
    # (metric, queue, "label=value"...) -> the sum of the metric over the queue's series with
    # those labels (counters, workers); no series counts as 0
    totals: dict[tuple[str, ...], float] = field(default_factory=dict)
    sources_up: tuple[str, ...] = ()
    gaps: tuple[Gap, ...] = ()
    # what only this system records, checked on the same scrape: its differences
    extra: Callable[[Series], list[str]] | None = None


class ReadTimes:
    """When a source's served values were read, from its successes as the exporter serves them:
    after the success before it (its cycles run one after another; the first after the exporter
    started), before its own. No margin of our own, however late a loaded host lets the test
    look."""

    def __init__(self, exporter_started: float) -> None:
        self.started = exporter_started
        self.successes: dict[str, set[float]] = {}

    def window(self, series: Series, read: ReadAge) -> tuple[float, float] | None:
        metric = "queue_exporter_source_last_success_timestamp_seconds"
        last = value(series, metric, source=read.source)
        if last is None:
            return None
        seen = self.successes.setdefault(read.source, set())
        after = max((t for t in seen if t < last), default=self.started)
        seen.add(last)
        # libraries' times may come in milliseconds: `since` may be up to 1 ms early
        return after - read.since - 0.001, last - read.since


class _Checker:
    """Collects the differences, a known gap's check held to what it serves today."""

    def __init__(self, gaps: Iterable[Gap]) -> None:
        self.gaps = list(gaps)
        self.used: set[int] = set()  # the gaps' ids: a gap's `today` may be a list
        self.found: list[str] = []

    def check(self, key: str, served: object, agrees: bool, truth: str) -> None:
        gap = next((gap for gap in self.gaps if gap.covers(key)), None)
        if gap is None:
            if not agrees:
                self.found.append(f"{key}: served {served}, {truth}")
            return
        self.used.add(id(gap))
        if agrees:
            self.found.append(f"known gap {key} ({gap.point}) passes now: take it out")
        elif served != gap.today:
            self.found.append(f"{key}: served {served}, known gap serves {gap.today}; {truth}")

    def unused(self) -> list[str]:
        return [
            f"known gap {gap.key} matches no check" for gap in self.gaps if id(gap) not in self.used
        ]


def served_value(series: Series, system: str, name: str, **labels: str) -> float | None:
    """The one series of `name` with these labels, or None (none, or several)."""
    wanted = {("system", system), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return values[0] if len(values) == 1 else None


def served_sum(series: Series, system: str, name: str, **labels: str) -> float | None:
    wanted = {("system", system), *labels.items()}
    values = [v for (n, ls), v in series.items() if n == name and wanted <= ls]
    return sum(values) if values else None


def served_keys(series: Series, system: str, name: str) -> set[State]:
    return {
        (labels["queue"], labels.get("state", ""))
        for metric, label_set in series
        if metric == name and (labels := dict(label_set)).get("system") == system
    }


def mismatches(
    series: Series,
    truth: Truth,
    scraped_at: float,
    variant: str = "defaults",
    reads: ReadTimes | None = None,
) -> list[str]:
    """Every difference between the served series and the library's truth, for one run."""
    checker = _Checker(gap for gap in truth.gaps if gap.variant == variant)
    if truth.depths is not None:
        _queues_and_depths(checker, series, truth, truth.depths)
    _due(checker, series, truth)
    _ages(checker, series, truth, scraped_at, reads)
    for (metric, queue, *pairs), expected in sorted(truth.totals.items()):
        labels = dict(pair.split("=", 1) for pair in pairs)
        served = served_sum(series, truth.system, metric, queue=queue, **labels) or 0
        key = " ".join(["total", metric, queue, *pairs])
        checker.check(key, served, served == expected, f"truth {expected}")
    for source in truth.sources_up:
        up = value(series, "queue_exporter_source_up", source=source)
        checker.check(f"up {source}", up, up == 1, "must be up")
    extra = [] if truth.extra is None else truth.extra(series)
    return checker.found + extra + checker.unused()


def _labels(where: Where) -> dict[str, str]:
    """A (queue, state[, priority]) key's labels."""
    return dict(zip(("queue", "state", "priority"), where, strict=False))


def _queues_and_depths(
    checker: _Checker, series: Series, truth: Truth, depths: dict[Where, float]
) -> None:
    system = truth.system
    served = served_keys(series, system, "queue_depth")
    if truth.exact_states:
        extra = sorted(served - {(queue, state) for queue, state, *_ in depths})
        checker.check("states", extra, not extra, "served for no state the library has")
    queues = sorted({queue for queue, _ in served})
    expected = sorted({queue for queue, *_ in depths})
    checker.check("queues", queues, queues == expected, f"truth {expected}")
    per_state: dict[str, float] = {}
    for where, count in sorted(depths.items()):
        state = where[1]
        depth = served_value(series, system, "queue_depth", **_labels(where))
        checker.check(f"depth {' '.join(where)}", depth, depth == count, f"truth {count}")
        per_state[state] = per_state.get(state, 0) + count
    for state, count in sorted(per_state.items()):  # the totals over queues, as a sum query
        summed = served_sum(series, system, "queue_depth", state=state) or 0
        checker.check(f"sum {state}", summed, summed == count, f"truth {count}")


def _due(checker: _Checker, series: Series, truth: Truth) -> None:
    for queue, count in sorted(truth.due.items()):
        due = served_value(series, truth.system, "queue_scheduled_due", queue=queue)
        checker.check(f"due {queue}", due, due == count, f"truth {count}")
    if truth.exact_due:
        served = {queue for queue, _ in served_keys(series, truth.system, "queue_scheduled_due")}
        extra = sorted(served - set(truth.due))
        checker.check("due queues", extra, not extra, "due served where the library has none")


def _ages(
    checker: _Checker, series: Series, truth: Truth, scraped_at: float, reads: ReadTimes | None
) -> None:
    for where, age in sorted(truth.ages.items()):
        key = f"age {' '.join(where)}"
        served = served_value(series, truth.system, "queue_oldest_age_seconds", **_labels(where))
        if age is None:
            checker.check(key, served, served is None, "no such job")
            continue
        if isinstance(age, ReadAge):
            assert reads is not None, f"{key}: a ReadAge needs the run's ReadTimes"
            window = reads.window(series, age)
        else:
            window = age.window(truth.taken_at, scraped_at)
        agrees = served is not None and window is not None and window[0] <= served <= window[1]
        shown = "no read" if window is None else f"{window[0]:.2f} to {window[1]:.2f}"
        checker.check(key, served, agrees, f"truth {shown}")
    if truth.exact_ages:
        expected = {(key[0], key[1]) for key, age in truth.ages.items() if age is not None}
        extra = sorted(served_keys(series, truth.system, "queue_oldest_age_seconds") - expected)
        checker.check("age states", extra, not extra, "ages served for no such job")


def served_signals(series: Series, system: str) -> set[str]:
    """The signals (exporter.output.catalog.SIGNALS) served for `system`: a series of the signal's
    metric with a queue (a label not empty), in one of its states."""
    found = set()
    for metric, label_set in series:
        labels = dict(label_set)
        if labels.get("system") != system or not labels.get("queue"):
            continue
        for signal in SIGNALS:
            if metric == signal.metric and (
                not signal.states or labels.get("state") in signal.states
            ):
                found.add(signal.name)
    return found


def unnamed_signals(
    served: set[str], not_recorded: dict[str, str], not_served: dict[str, str]
) -> list[str]:
    """Each signal operators page on is served or named as not recorded (the preset's
    `not_recorded`), never both: one neither served nor named is missing silently, one named
    and served is documented wrongly. `not_served`: the adapter's signals the system records
    that its run may not show (a version's cost, a scenario whose events can fall before the
    reader's first read), each with why: excused when absent, never needed when served."""
    found = []
    for signal in SIGNALS:
        name = signal.name
        if name in served and name in not_recorded:
            found.append(f"signal {name}: served, yet named not recorded")
        elif name not in served and name not in not_recorded and name not in not_served:
            found.append(f"signal {name}: neither served nor named not recorded")
    return found
