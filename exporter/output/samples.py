"""A snapshot of sampled values: what one source cycle publishes to telemetry at once.

Series come in two forms, read alike through Series:
- one at a time (Redis keys): a dict of label values -> value per metric;
- whole columns (SQL results): SeriesColumns, one label column or constant per label and a
  value column. No tuple or dict entry is made per series until somebody reads them, which is
  most of what converting a 10k-row result would cost (bench/postgres_sampling.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

from exporter.output.catalog import MetricSpec

LabelValues = tuple[str, ...]
# One label of many series: a value per series, or one text they all share.
LabelColumn = Sequence[str] | str


@dataclass(frozen=True)
class SeriesColumns:
    """Series of one metric as columns. Their label sets are distinct: whoever builds one checks."""

    labels: tuple[LabelColumn, ...]  # in spec.labels order
    values: Sequence[float]

    def __len__(self) -> int:
        return len(self.values)

    def items(self) -> Iterator[tuple[LabelValues, float]]:
        return zip(self.label_sets(), self.values, strict=True)

    def label_sets(self) -> Iterator[LabelValues]:
        rows = len(self.values)
        parts = [repeat(label, rows) if isinstance(label, str) else label for label in self.labels]
        return zip(*parts, strict=True) if parts else repeat((), rows)

    def disjoint_from(self, other: SeriesColumns) -> bool:
        """True when some label is a constant that differs (state="pending" / "active")."""
        return any(
            isinstance(mine, str) and isinstance(theirs, str) and mine != theirs
            for mine, theirs in zip(self.labels, other.labels, strict=True)
        )


# What a Series is made of: dicts and column blocks, no two holding the same label set.
SeriesPart = Mapping[LabelValues, float] | SeriesColumns


class Series:
    """One metric's series as published: read-only parts that share no label set."""

    __slots__ = ("parts",)

    def __init__(self, parts: Iterable[SeriesPart]) -> None:
        self.parts = tuple(parts)

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def items(self) -> Iterator[tuple[LabelValues, float]]:
        return chain.from_iterable(part.items() for part in self.parts)

    def plus(self, other: Series) -> Series:
        """Both, with the values of a label set found in each added up."""
        total = dict(self.items())
        for labels, value in other.items():
            total[labels] = total.get(labels, 0.0) + value
        return Series((total,))


def padded(series: Series, width: int) -> Series:
    """The series with empty label values added, last, up to `width` labels: a family some
    feeds give one more label than others (redis_source) is written with it on every line,
    empty (the same as absent, to Prometheus) where a feed has none."""
    missing = width - len(next(iter(series.items()), ((),))[0])
    if missing <= 0 or not len(series):
        return series
    blanks = ("",) * missing
    return Series(({(*labels, *blanks): value for labels, value in series.items()},))


def label_sets_and_values(part: SeriesPart) -> tuple[Iterator[LabelValues], Iterator[float]]:
    """The part's label sets and its values, in the same order: a writer that takes them apart
    makes no (label values, value) pair per series."""
    if isinstance(part, SeriesColumns):
        return part.label_sets(), iter(part.values)
    return iter(part), iter(part.values())


def longest_label(series: Iterable[Series]) -> int:
    """The longest label value of these series; a column several blocks share is measured once."""
    lengths = [0]
    measured: set[int] = set()
    for part in chain.from_iterable(one.parts for one in series):
        if not isinstance(part, SeriesColumns):
            lengths.append(max(map(len, chain.from_iterable(part)), default=0))
            continue
        for column in part.labels:
            if isinstance(column, str):
                lengths.append(len(column))
            elif id(column) not in measured:
                measured.add(id(column))
                lengths.append(max(map(len, column), default=0))
    return max(lengths)


class SampleSet:
    """Values keyed by metric and label values, combined when two keys map to one series.

    How they combine is the metric's (catalog.MetricSpec.combine).
    """

    def __init__(self) -> None:
        self._tables: dict[MetricSpec, dict[LabelValues, float]] = {}
        self._blocks: dict[MetricSpec, list[SeriesColumns]] = {}

    def add(self, spec: MetricSpec, labels: dict[str, str], value: float) -> None:
        """Add a sample; labels the spec does not name are ignored, missing ones are ""."""
        self.add_labelled(spec, tuple(labels.get(name, "") for name in spec.labels), value)

    def add_labelled(self, spec: MetricSpec, label_values: LabelValues, value: float) -> None:
        """Like add, with the label values already in spec.labels order (the hot path)."""
        series = self.table(spec)
        previous = series.get(label_values)
        series[label_values] = value if previous is None else spec.combined(previous, value)

    def table(self, spec: MetricSpec) -> dict[LabelValues, float]:
        """The metric's series added one at a time, for a loop that adds many: whoever writes
        to it combines a label set already there with spec.combined, as add_labelled does."""
        series = self._tables.get(spec)
        if series is None:
            series = self._tables[spec] = dict(self._pop_blocks(spec))
        return series

    def add_columns(self, spec: MetricSpec, block: SeriesColumns) -> None:
        """Add many series at once, kept as columns while they cannot meet other series of the
        metric; otherwise they are added one by one and combine."""
        blocks = self._blocks.get(spec, [])
        if spec not in self._tables and all(block.disjoint_from(other) for other in blocks):
            self._blocks[spec] = [*blocks, block]
            return
        for label_values, value in block.items():
            self.add_labelled(spec, label_values, value)

    def discard(self, spec: MetricSpec, label_sets: Iterable[LabelValues]) -> None:
        """Remove these series of the metric (those added one at a time)."""
        table = self._tables.get(spec)
        for label_values in label_sets if table is not None else ():
            table.pop(label_values, None)  # type: ignore[union-attr]

    def with_label(self, label: str, value: str) -> SampleSet:
        """The same samples with one more label, last, of one value for all of them."""
        labelled = SampleSet()
        for spec, series in self.metrics():
            table = {(*labels, value): number for labels, number in series.items()}
            labelled._tables[spec.with_label(label)] = table
        return labelled

    def metrics(self) -> Iterator[tuple[MetricSpec, Series]]:
        for spec, table in self._tables.items():
            yield spec, Series((table,))
        for spec, blocks in self._blocks.items():
            yield spec, Series(blocks)

    def __len__(self) -> int:
        return sum(len(series) for _, series in self.metrics())

    def _pop_blocks(self, spec: MetricSpec) -> Iterator[tuple[LabelValues, float]]:
        """The metric's column blocks, read out (disjoint: no combining needed)."""
        return chain.from_iterable(block.items() for block in self._blocks.pop(spec, []))
