"""The one metrics store: every family of the catalog the exporter serves, in one place.

The renderer (exposition.py) and OTLP (otlp.py) both read it through `families()`. What is
kept here, by how it arrives:
- sampled snapshots: a source's cycle publishes them whole, replacing what it published
  before; a failing source withdraws them, so they disappear instead of going stale;
- event counters and explicit-bucket histograms: updated in bulk, one batch at a time. A
  batch costs a dict lookup per distinct label set and a bisect per observation; the
  OpenTelemetry SDK's per-observation `add`/`record` (5-8.5 µs each) held the event consumer
  at 0.20x of a bare read loop (bench/event_ingest.py, docs/benchmarks.md);
- event gauges (workers): computed when read, by the readers registered here.

The exporter's own self-metrics are not kept here: they are OpenTelemetry instruments
(telemetry.py), under names disjoint from these.

Cardinality: a metric holds at most `max_series_per_metric` samples, so that a scrape's size
is bounded by the cap. A histogram series is as many samples as its buckets plus `_sum` and
`_count`, so a histogram admits that many times fewer label sets. Where a family has two feeds
(Attune's sampled totals and the event counters of the same name), they share its room.
Label sets beyond the cap share one `__overflow__` label set and are counted in
queue_exporter_series_overflow_total.

Every value kept can be written soundly: a number (a gauge's may be NaN or infinite, which
both formats spell), a counter's and a histogram observation's finite and not negative. Each
source checks its values (numbers.py) and counts what it refuses; what would still come unsound
through `apply` is dropped here and logged, so no stored value can make a render fail or a sum
NaN. Series a caller holds (counter_series, histogram_series: the frequent lifecycle events')
take only values its own checks bound (readers/v1.py's plain path).

Exemplars: an observation that carries a trace context (a lifecycle event's traceparent) may
come with an Exemplar. A histogram series keeps the last one of each bucket, a counter series
the last one: at most buckets + 1 (or 1) per series, whatever the traffic, and none at all
(one empty slot) for series whose events carry no trace context. They go with their series:
dropped when it idles out, folded with it into the overflow set.

Event series no batch has updated for `idle_timeout` seconds are dropped and leave the
guard, so job types that come and go do not grow memory without bound. A dropped counter
that comes back starts again from zero, which rate() and increase() read as a reset.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from exporter.core.logs import LogLimiter
from exporter.core.numbers import all_finite, is_finite
from exporter.output.catalog import ALL, BY_NAME, MetricSpec
from exporter.output.samples import (
    LabelValues,
    SampleSet,
    Series,
    SeriesColumns,
    SeriesPart,
    longest_label,
    padded,
)

OVERFLOW = "__overflow__"

log = logging.getLogger(__name__)
_unsound_log = LogLimiter(log)
_FLOAT_MAX = sys.float_info.max

SeriesKey = tuple[str, LabelValues]
# Per bucket counts (not cumulative, the last one is +Inf), sum, count.
HistogramPoint = tuple[list[int], float, int]
GaugeReader = Callable[[], Iterable[tuple[MetricSpec, Series]]]


class Exemplar(NamedTuple):
    """One observation and the trace it was made in: OpenMetrics' and OTLP's exemplar."""

    value: float  # the observed value (a counter's: its increment)
    trace_id: str  # 32 lowercase hex digits (W3C trace context)
    span_id: str  # 16 lowercase hex digits
    time: float  # the observation's time, seconds since the epoch


# A histogram series' exemplars, one slot a bucket (+Inf last): None where none was kept.
BucketExemplars = list[Exemplar | None]


@dataclass(frozen=True, slots=True)
class NumberFamily:
    """A gauge or counter family as read at one moment."""

    spec: MetricSpec
    series: Series
    # A counter's series that keep an exemplar (only those), by label values.
    exemplars: Mapping[LabelValues, Exemplar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HistogramFamily:
    spec: MetricSpec
    bounds: tuple[float, ...]
    series: dict[LabelValues, HistogramPoint]
    # The series that keep an exemplar (only those): one slot a bucket.
    exemplars: dict[LabelValues, BucketExemplars] = field(default_factory=dict)


Family = NumberFamily | HistogramFamily


class SeriesGuard:
    """Admits label sets per metric while the metric has room; the rest share the overflow set.

    A metric's room is counted in samples: `limit` divided by the samples one series of the
    metric takes (a histogram's buckets, `_sum` and `_count`; two for the worker gauges'
    busy/idle pair), less one for the overflow set where refused label sets fold into one.
    """

    def __init__(
        self, limit: int, max_label_length: int, on_overflow: Callable[[str, int], None]
    ) -> None:
        self.limit = limit
        self.max_label_length = max_label_length
        self._on_overflow = on_overflow
        self._admitted: dict[str, set[LabelValues]] = {}
        self._samples_per_series: dict[str, int] = {}
        self._dropping: set[str] = set()
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def set_samples_per_series(self, metric: str, samples: int, folds: bool = True) -> None:
        """How many samples one series of the metric is; `folds`: whether refused label sets
        go to an overflow series (which takes room too) or are dropped."""
        self._samples_per_series[metric] = samples
        if not folds:
            self._dropping.add(metric)

    def room(self, metric: str) -> int:
        """Label sets the metric may admit besides its overflow set."""
        return max(self.whole_room(metric) - self._held.get(metric, 0), 0)

    def whole_room(self, metric: str) -> int:
        """Label sets the metric may hold besides its overflow set, from every feed."""
        reserved = 0 if metric in self._dropping else 1
        return self.limit // self._samples_per_series.get(metric, 1) - reserved

    def hold(self, held: dict[str, int]) -> None:
        """Series served from snapshots, by metric: where a family is fed by snapshots and by
        events too (Attune's totals and the event counters), they take room from admissions."""
        self._held = held

    def admit(self, metric: str, labels: LabelValues) -> LabelValues:
        """The labels to record under: these, or the overflow set once the metric is full."""
        labels = self.clip(labels)
        admitted = self._admitted.setdefault(metric, set())
        if labels in admitted:
            return labels
        with self._lock:
            if len(admitted) < self.room(metric):
                admitted.add(labels)
                return labels
        self._on_overflow(metric, 1)
        return (OVERFLOW,) * len(labels)

    def refused(self, metric: str, count: int) -> None:
        """Count label sets folded into the overflow set elsewhere (whole snapshots)."""
        self._on_overflow(metric, count)

    def forget(self, metric: str, labels: LabelValues) -> None:
        with self._lock:
            self._admitted.get(metric, set()).discard(labels)

    def keep_only(self, metric: str, present: set[LabelValues]) -> None:
        """Forget the metric's label sets not in `present` (gauges whose series went away)."""
        with self._lock:
            self._admitted.get(metric, set()).intersection_update(present)

    def admitted_count(self) -> int:
        with self._lock:
            return sum(len(labels) for labels in self._admitted.values())

    def clip(self, labels: LabelValues) -> LabelValues:
        cap = self.max_label_length
        if all(len(value) <= cap for value in labels):
            return labels
        return tuple(value[:cap] for value in labels)


# A series keeps the time of its last update itself: a batch then looks each of its label sets
# up once, where a table of times by (metric, labels) hashed them twice more per update.


class _Series:
    __slots__ = ("touched",)

    def __init__(self) -> None:
        self.touched = 0.0  # the clock's time of the last update


class CounterSeries(_Series):
    __slots__ = ("exemplar", "value")

    def __init__(self) -> None:
        super().__init__()
        self.value = 0.0
        self.exemplar: Exemplar | None = None  # the last increment that carried one

    def add(self, amount: float, now: float) -> None:
        """An increment known sound (MetricStore.apply checks those it is given)."""
        self.value += amount
        self.touched = now


class HistogramSeries(_Series):
    __slots__ = ("bounds", "buckets", "count", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        super().__init__()
        self.bounds = bounds  # its metric's (fixed once it has an observation)
        self.buckets = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last: +Inf
        self.sum = 0.0
        self.count = 0
        # Made at the first exemplar: the last one of each bucket.
        self.exemplars: BucketExemplars | None = None

    def observe(self, value: float, now: float) -> None:
        """One value known sound (MetricStore.apply checks those it is given)."""
        self.buckets[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1
        self.touched = now

    def observe_all(self, values: list[float], now: float) -> None:
        """A batch's values of the series, known sound."""
        bounds, buckets = self.bounds, self.buckets
        for value in values:
            buckets[bisect_left(bounds, value)] += 1
        self.sum += sum(values, 0.0)  # a float sum: integers near float range add up to inf
        self.count += len(values)
        self.touched = now


_S = TypeVar("_S", bound=_Series)

# MetricStore.generation: one sequence for all stores of the process.
_generations = itertools.count()


class MetricStore:
    def __init__(
        self,
        guard: SeriesGuard,
        idle_timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        serves: Callable[[str], bool] = lambda source: True,
    ) -> None:
        """`serves(source)` is asked at every read: a published snapshot it refuses (one taken
        under a leader lease that has passed, Telemetry.publish) is left out of that read."""
        self.guard = guard
        self.idle_timeout = idle_timeout
        self.clock = clock  # injectable: the soak test drives hours of churn in seconds
        self.serves = serves
        self._snapshots: dict[str, dict[MetricSpec, Series]] = {}
        self._snapshot_lock = threading.Lock()
        self._lock = threading.Lock()  # counters, histograms and their bookkeeping
        self._counters: dict[str, dict[LabelValues, CounterSeries]] = {}
        self._histograms: dict[str, dict[LabelValues, HistogramSeries]] = {}
        self._next_sweep = 0.0
        # New whenever series are dropped (a series held from before may be gone), and never
        # another store's: a series held is of this store as long as its generation is this one.
        self.generation = next(_generations)
        self._bounds: dict[str, tuple[float, ...]] = {}
        self._gauge_readers: list[GaugeReader] = []
        self._event_label: str | None = None
        # Metrics whose series ever kept an exemplar: a render looks for them there alone.
        self._exemplified: set[str] = set()
        self.dropped_values = 0  # unsound values no source refused (a bug: tests assert 0)
        for spec in ALL:
            if spec.kind == "histogram":
                self._set_bounds(spec.name, spec.buckets)

    # -- sampled snapshots -------------------------------------------------------------------

    def publish(self, source: str, samples: SampleSet) -> None:
        """Replace everything `source` published before with this snapshot."""
        published = {spec: self._sound(spec, series) for spec, series in samples.metrics()}
        clip = longest_label(published.values()) > self.guard.max_label_length
        capped = {spec: self._cap(source, spec, series, clip) for spec, series in published.items()}
        with self._snapshot_lock:
            self._snapshots[source] = capped
            self._hold_snapshot_series()

    def withdraw(self, source: str) -> None:
        """Drop a failing source's series rather than serve them stale."""
        with self._snapshot_lock:
            self._snapshots.pop(source, None)
            self._hold_snapshot_series()

    def _hold_snapshot_series(self) -> None:
        held: dict[str, int] = {}
        for published in self._snapshots.values():
            for spec, series in published.items():
                held[spec.name] = held.get(spec.name, 0) + len(series)
        self.guard.hold(held)

    def _cap(self, source: str, spec: MetricSpec, series: Series, clip: bool) -> Series:
        if clip:  # rare: most snapshots are published without a copy
            series = _clipped(spec, series, self.guard.clip)
        with self._snapshot_lock:
            used_elsewhere = sum(
                len(published.get(spec, ()))
                for name, published in self._snapshots.items()
                if name != source
            )
        with self._lock:  # event counters of the same family
            used_elsewhere += len(self._counters.get(spec.name, ()))
        room = self.guard.whole_room(spec.name) - used_elsewhere
        if len(series) <= room + 1:
            return series
        values = dict(series.items())
        kept = {labels: values[labels] for labels in _fair_share(list(values), max(room, 0))}
        refused = [value for labels, value in values.items() if labels not in kept]
        overflow_labels = (OVERFLOW,) * len(spec.labels)
        kept[overflow_labels] = functools.reduce(spec.combined, refused)
        self.guard.refused(spec.name, len(refused))
        return Series((kept,))

    def snapshot_series(self) -> dict[MetricSpec, Series]:
        """All published series merged across sources (sums where two sources meet)."""
        merged: dict[MetricSpec, Series] = {}
        with self._snapshot_lock:
            published = [
                snapshot for source, snapshot in self._snapshots.items() if self.serves(source)
            ]
        for snapshot in published:
            for spec, series in snapshot.items():
                earlier = merged.get(spec)
                merged[spec] = series if earlier is None else earlier.plus(series)
        return _one_spec_per_name(merged)

    def _sound(self, spec: MetricSpec, series: Series) -> Series:
        """The series without values a render cannot write soundly: no numbers, and a
        counter's non-finite or negative ones (the common case: all sound, the series itself)."""
        counter = spec.kind == "counter"
        if all(_sound_values(_values(part), counter) for part in series.parts):
            return series
        kept = {labels: value for labels, value in series.items() if _sound_value(value, counter)}
        if len(kept) < len(series):
            self._dropped(spec.name, len(series) - len(kept))
        return Series((kept,))

    def _dropped(self, metric: str, count: int) -> None:
        self.dropped_values += count
        _unsound_log.warning(
            metric,
            "%s: %d value(s) not numbers (or counts not finite, negative) dropped: their source "
            "did not refuse them (a bug)",
            metric,
            count,
        )

    # -- event counters and histograms -------------------------------------------------------

    def label_events(self, label: str) -> None:
        """Every event series (counters, histograms, worker gauges) carries `label`, last: its
        feeds give its value (EventMetrics, with several Redis sources: redis_source)."""
        self._event_label = label

    def event_spec(self, name: str) -> MetricSpec:
        """The family an event series of `name` is served under."""
        spec = BY_NAME[name]
        return spec if self._event_label is None else spec.with_label(self._event_label)

    def set_buckets(self, metric: str, bounds: Iterable[float]) -> None:
        """The bucket bounds of a histogram; fixed once it has an observation."""
        bounds = tuple(sorted(float(bound) for bound in bounds))
        with self._lock:
            if self._histograms.get(metric) and self._bounds.get(metric) != bounds:
                raise ValueError(f"{metric}: buckets cannot change once observed")
            self._set_bounds(metric, bounds)

    def _set_bounds(self, metric: str, bounds: Iterable[float]) -> None:
        self._bounds[metric] = tuple(float(bound) for bound in bounds)
        # Each bound, +Inf, _sum and _count: one sample each.
        self.guard.set_samples_per_series(metric, len(self._bounds[metric]) + 3)

    def buckets(self, metric: str) -> tuple[float, ...]:
        return self._bounds[metric]

    def apply(
        self,
        counts: dict[SeriesKey, float],
        observations: dict[SeriesKey, list[float]],
        exemplars: dict[SeriesKey, list[Exemplar]] | None = None,
        held: Callable[[float], None] | None = None,
    ) -> None:
        """Add one batch: counter increments and histogram observations by metric and labels,
        and the exemplars of those that carried a trace context (each already counted or
        observed in this batch). `held(now)`, first: the batch's updates of series its caller
        holds (counter_series, histogram_series), under the same lock, so a read sees the
        batch whole or not at all."""
        now = self.clock()
        # The batch's values checked at once (one C loop), not series by series: a batch's
        # histogram series mostly hold one or two values each (bench/event_ingest.py).
        sound = _sound_values([v for values in observations.values() for v in values], True)
        with self._lock:
            if held is not None:
                held(now)
            for (metric, labels), amount in counts.items():
                if not 0 <= amount <= _FLOAT_MAX:  # also refuses nan and huge integers
                    self._dropped(metric, 1)
                    continue
                self.counter_series(metric, labels)[0].add(amount, now)
            for (metric, labels), values in observations.items():
                if not sound:
                    values = self._sound_only(metric, values)
                self.histogram_series(metric, labels)[0].observe_all(values, now)
            if exemplars:
                self._keep_exemplars(exemplars)
            self._sweep_when_due(now)

    def counter_series(self, metric: str, labels: LabelValues) -> tuple[CounterSeries, bool]:
        """The series an increment under `labels` goes to (theirs, new, or the overflow's), and
        whether it is theirs: then its caller may hold it, and update it from `held`, while
        `generation` stays the same. Only under the lock: in `apply` or its `held`."""
        series = self._counters.get(metric)
        if series is None:  # not setdefault: it would build an empty dict per call
            series = self._counters[metric] = {}
        state = series.get(labels)
        if state is not None:
            return state, True
        state = self._new_series(series, metric, labels, CounterSeries)  # ask the guard
        return state, series.get(labels) is state

    def histogram_series(self, metric: str, labels: LabelValues) -> tuple[HistogramSeries, bool]:
        """counter_series' counterpart for a histogram."""
        series = self._histograms.get(metric)
        if series is None:
            series = self._histograms[metric] = {}
        state = series.get(labels)
        if state is not None:
            return state, True
        bounds = self._bounds[metric]
        state = self._new_series(series, metric, labels, lambda: HistogramSeries(bounds))
        return state, series.get(labels) is state

    def _keep_exemplars(self, exemplars: dict[SeriesKey, list[Exemplar]]) -> None:
        """Each exemplar in the series its observation went to (its own, or the overflow's):
        a histogram's in the slot of its bucket, a counter's as the one it keeps. Read from
        the last: only those that stay are checked (sound_exemplar), an earlier one of the
        same slot is passed over unread."""
        for (metric, labels), kept in exemplars.items():
            histograms = self._histograms.get(metric)
            if histograms is not None:
                state = self._updated(histograms, labels)
                if state is not None:
                    self._keep_in_buckets(metric, state, kept)
            else:
                counted = self._updated(self._counters.get(metric, {}), labels)
                if counted is not None:
                    for exemplar in reversed(kept):
                        if sound_exemplar(exemplar):
                            counted.exemplar = exemplar
                            self._exemplified.add(metric)
                            break
                        self._dropped(metric, 1)

    def _keep_in_buckets(self, metric: str, state: HistogramSeries, kept: list[Exemplar]) -> None:
        bounds = state.bounds  # those its buckets were made for
        filled: set[int] = set()
        for exemplar in reversed(kept):
            bucket = bisect_left(bounds, exemplar.value)
            if bucket in filled:
                continue
            if not sound_exemplar(exemplar):
                self._dropped(metric, 1)
                continue
            slots = state.exemplars
            if slots is None:
                slots = state.exemplars = [None] * len(state.buckets)
            slots[bucket] = exemplar
            filled.add(bucket)
        if filled:
            self._exemplified.add(metric)

    def _updated(self, series: dict[LabelValues, _S], labels: LabelValues) -> _S | None:
        """The series this batch updated for `labels`: under them, clipped, or the overflow's
        (None: the update was refused, and its exemplar goes with it)."""
        state = series.get(labels)
        if state is None:
            state = series.get(self.guard.clip(labels))
        if state is None:
            state = series.get((OVERFLOW,) * len(labels))
        return state

    def _new_series(
        self,
        series: dict[LabelValues, _S],
        metric: str,
        labels: LabelValues,
        new: Callable[[], _S],
    ) -> _S:
        """The series to update for labels not seen before: theirs, new, or the overflow's."""
        labels = self.guard.admit(metric, labels)
        state = series.get(labels)
        if state is None:
            state = series[labels] = new()
        return state

    def _sound_only(self, metric: str, values: list[float]) -> list[float]:
        """The values a histogram can take (each checked: some of the batch's are not)."""
        kept = [value for value in values if _sound_value(value, True)]
        if len(kept) < len(values):
            self._dropped(metric, len(values) - len(kept))
        return kept

    def series_count(self) -> int:
        """Event counter and histogram series held."""
        with self._lock:
            return sum(len(series) for series in self._counters.values()) + sum(
                len(series) for series in self._histograms.values()
            )

    def expire_idle(self, now: float | None = None) -> int:
        """Drop the series not updated for idle_timeout; how many were dropped."""
        with self._lock:
            return self._expire(self.clock() if now is None else now)

    def _sweep_when_due(self, now: float) -> None:
        # A sweep walks every series: a few times per timeout is enough, and never per batch.
        if self.idle_timeout is not None and now >= self._next_sweep:
            self._next_sweep = now + min(self.idle_timeout / 4, 60.0)
            self._expire(now)

    def _expire(self, now: float) -> int:
        if self.idle_timeout is None:
            return 0
        oldest = now - self.idle_timeout
        return self._drop_idle(self._counters, oldest) + self._drop_idle(self._histograms, oldest)

    def _drop_idle(self, table: dict[str, dict[LabelValues, _S]], oldest: float) -> int:
        dropped = 0
        for metric, series in table.items():
            idle = [labels for labels, state in series.items() if state.touched < oldest]
            for labels in idle:
                del series[labels]
                self.guard.forget(metric, labels)
            dropped += len(idle)
        if dropped:
            self.generation = next(_generations)  # series held may be among them
        return dropped

    # -- event gauges ------------------------------------------------------------------------

    def add_gauge_reader(self, reader: GaugeReader) -> None:
        """A reader of gauges computed when read (its label sets admitted by the guard)."""
        self._gauge_readers.append(reader)

    # -- reading -----------------------------------------------------------------------------

    def families(self) -> list[Family]:
        """Every family with series, in catalog order, then those of the configuration; read
        whole under the locks, so a scrape sees each batch entirely or not at all."""
        numbers: dict[MetricSpec, list[Series]] = {}
        for spec, series in self.snapshot_series().items():
            numbers.setdefault(spec, []).append(series)
        with self._lock:
            self._sweep_when_due(self.clock())
            for name, counted in self._counters.items():
                if counted:
                    values = {labels: state.value for labels, state in counted.items()}
                    numbers.setdefault(self.event_spec(name), []).append(Series((values,)))
            histograms = {
                name: {
                    labels: (list(state.buckets), state.sum, state.count)
                    for labels, state in series.items()
                }
                for name, series in self._histograms.items()
                if series
            }
            counted_exemplars, observed_exemplars = self._exemplars()
        for reader in self._gauge_readers:
            for spec, series in reader():
                numbers.setdefault(spec, []).append(series)
        widened = _widened_specs(numbers)
        for spec, wide in widened.items():
            if spec in numbers:
                feeds = [padded(series, len(wide.labels)) for series in numbers.pop(spec)]
                numbers.setdefault(wide, []).extend(feeds)
        families: list[Family] = []
        for spec in ALL:
            spec = widened.get(spec, spec)
            if spec in numbers:
                kept = counted_exemplars.get(spec.name, {})
                families.append(NumberFamily(spec, _merged(numbers.pop(spec)), kept))
            elif spec.name in histograms:
                bounds = self._bounds[spec.name]
                spec = self.event_spec(spec.name)
                observed = observed_exemplars.get(spec.name, {})
                families.append(HistogramFamily(spec, bounds, histograms[spec.name], observed))
        # What is left: the families of SQL collectors, defined by the configuration.
        families += [NumberFamily(spec, _merged(feeds)) for spec, feeds in numbers.items()]
        return families

    def _exemplars(
        self,
    ) -> tuple[
        dict[str, dict[LabelValues, Exemplar]], dict[str, dict[LabelValues, BucketExemplars]]
    ]:
        """The exemplars kept, by metric then label values: the counters', the histograms' (a
        copy of each series' slots). Only the metrics that ever kept one are walked, so a store
        without exemplars pays nothing per series. Under self._lock."""
        counted: dict[str, dict[LabelValues, Exemplar]] = {}
        observed: dict[str, dict[LabelValues, BucketExemplars]] = {}
        for name in self._exemplified:
            if name in self._histograms:
                slots = {
                    labels: list(state.exemplars)
                    for labels, state in self._histograms[name].items()
                    if state.exemplars is not None
                }
                observed[name] = slots
            else:
                counted[name] = {
                    labels: state.exemplar
                    for labels, state in self._counters.get(name, {}).items()
                    if state.exemplar is not None
                }
        return counted, observed


_TRACE_ID = re.compile("[0-9a-f]{32}")
_SPAN_ID = re.compile("[0-9a-f]{16}")


def sound_exemplar(exemplar: Exemplar) -> bool:
    """Whether both formats can carry it as it is: W3C ids (lowercase hex; OTLP wants them
    as bytes), a finite non-negative value and time (a renderer spells them with str(),
    nothing escaped). Chained comparisons refuse NaN, infinities and integers past float
    range at a fraction of numbers.is_finite's cost: a traced event brings up to three."""
    value, trace_id, span_id, at = exemplar
    return (
        0 <= value <= _FLOAT_MAX
        and 0 <= at <= _FLOAT_MAX
        and _TRACE_ID.fullmatch(trace_id) is not None
        and _SPAN_ID.fullmatch(span_id) is not None
    )


def _values(part: SeriesPart) -> Iterable[float]:
    return part.values if isinstance(part, SeriesColumns) else part.values()


def _sound_values(values: Iterable[float], counted: bool) -> bool:
    """True when every value is a number, and for a count (`counted`) finite and not
    negative (numbers.py: the one check)."""
    if counted:
        return all_finite(values, non_negative=True)
    try:
        sum(values)  # a gauge's NaN, infinity, huge integer: the renderer spells them all
    except TypeError:
        return False
    except OverflowError:  # an integer beyond float range met a float: numbers all the same
        return True
    return True


def _sound_value(value: float, counted: bool) -> bool:
    if counted:
        return is_finite(value, non_negative=True)
    return isinstance(value, int | float)


def _widened_specs(specs: Iterable[MetricSpec]) -> dict[MetricSpec, MetricSpec]:
    """Each family also fed with more labels (redis_source): its widest form, by the others."""
    widest: dict[str, MetricSpec] = {}
    for spec in specs:
        narrower = widest.get(spec.name) or BY_NAME.get(spec.name, spec)
        if len(spec.labels) > len(narrower.labels):
            widest[spec.name] = spec
    return {
        spec: widest[spec.name]
        for spec in [*specs, *ALL]
        if spec.name in widest and spec != widest[spec.name]
    }


def _one_spec_per_name(merged: dict[MetricSpec, Series]) -> dict[MetricSpec, Series]:
    """Feeds of a family with and without redis_source, as one family with it."""
    widened = _widened_specs(list(merged))
    if not widened:
        return merged
    unified: dict[MetricSpec, Series] = {}
    for spec, series in merged.items():
        wide = widened.get(spec, spec)
        series = padded(series, len(wide.labels))
        earlier = unified.get(wide)
        unified[wide] = series if earlier is None else earlier.plus(series)
    return unified


def _merged(feeds: list[Series]) -> Series:
    """One family fed twice (Attune's sampled totals and the event counters of the same
    name): one series per label set, the values added up."""
    merged = feeds[0]
    for other in feeds[1:]:
        merged = merged.plus(other)
    return merged


def _clipped(
    spec: MetricSpec, series: Series, clip: Callable[[LabelValues], LabelValues]
) -> Series:
    """The series with long label values cut; series that then meet combine."""
    cut: dict[LabelValues, float] = {}
    for labels, value in series.items():
        labels = clip(labels)
        earlier = cut.get(labels)
        cut[labels] = value if earlier is None else spec.combined(earlier, value)
    return Series((cut,))


def _fair_share(label_sets: list[LabelValues], room: int) -> list[LabelValues]:
    """At most `room` label sets, shared out evenly among the values of the first label (the
    system, for every sampled metric): one layout with a thousand keys must not push another
    layout's few queues into the overflow series. A value needing less than its share leaves
    the rest to the others."""
    by_first: dict[str, list[LabelValues]] = {}
    for labels in label_sets:
        by_first.setdefault(labels[0] if labels else "", []).append(labels)
    kept: list[LabelValues] = []
    groups = sorted(by_first.values(), key=len)
    for position, members in enumerate(groups):
        share = (room - len(kept)) // (len(groups) - position)
        kept += members[:share]
    return kept
