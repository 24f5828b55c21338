"""SQL collectors: a query, which of its columns are labels, which are values and what they become.

The format operators write in the config file (and the attune preset is written in). What can be
checked without a database is checked when the configuration loads: names, types, label sets,
duplicates, clashes with the exporter's built-in metrics. What depends on the query's result
(a column missing, a value column that is not a number) is checked against the columns the
database returns, before any row is read (RowConverter).

A value bound to a built-in metric (queue_depth, ...) takes the catalog's definition, so its
series carry the contract's labels; any other metric name defines a custom metric.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from exporter.core.models import StrictModel
from exporter.core.numbers import all_finite, is_finite
from exporter.output.catalog import BY_NAME, MetricSpec
from exporter.output.samples import SampleSet, SeriesColumns

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_COLLECTOR_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
RESERVED_PREFIX = "queue_exporter_"

# PostgreSQL type OIDs a value column may have: integers, floats, numeric, oid, boolean (0/1).
NUMERIC_TYPE_OIDS = {16: "boolean", 20: "bigint", 21: "smallint", 23: "integer", 26: "oid",
                     700: "real", 701: "double precision", 1700: "numeric"}  # fmt: skip
# Label columns of these types (text, varchar, name, bpchar) need no conversion but NULL -> "".
TEXT_TYPE_OIDS = {25, 1043, 19, 1042}


class QueryShapeError(Exception):
    """The query's result does not have the columns the collector's config names."""


class CollectorRefused(Exception):
    """The collector's refuse_when found it does not apply to this database; the text says why."""


class SqlValue(StrictModel):
    column: str = Field(description="result column holding the value")
    metric: str = Field(description="metric name: a built-in one (queue_depth, ...) or your own")
    type: Literal["gauge", "counter"] | None = Field(
        None, description="custom metrics only (default gauge); counters end in _total"
    )
    help: str | None = Field(None, description="custom metrics only")
    labels: dict[str, str] = Field(
        default_factory=dict, description="static labels of this value's series"
    )
    on_null: Literal["count", "skip"] = Field(
        "count",
        description="a NULL is never exported; count: also counted as an error "
        "(reason null_value); skip: NULL is expected (e.g. no oldest item in an empty queue)",
    )
    age: bool = Field(
        False,
        description="the value is an age in seconds as of the read (now() - a recorded time): "
        "a collector with a longer interval serves it grown by the time since its last read at "
        "every sample_interval, instead of a number frozen until the next read",
    )

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, name: str) -> str:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid metric name")
        return name

    @field_validator("labels")
    @classmethod
    def _label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        return _check_label_names(labels)


class SqlCollector(StrictModel):
    name: str = Field(description="the source is named postgres:<name>")
    enabled: bool = Field(
        True, description="run it (off: as if absent; a preset's param turns one on or off)"
    )
    query: str = Field(description="one read-only statement")
    refuse_when: str | None = Field(
        None,
        description="a read-only statement run before the first read and after a failed one: "
        "a row whose column `refusal` is not NULL stops the run with that text (reason "
        "refused), for a database the collector does not apply to",
    )
    labels: list[str] = Field(
        default_factory=list, description="result columns that become labels (same name)"
    )
    static_labels: dict[str, str] = Field(
        default_factory=dict, description="labels added to every series of the collector"
    )
    values: list[SqlValue] = Field(min_length=1)
    interval: float | None = Field(
        None, gt=0, description="seconds between runs (default: the postgres sample_interval)"
    )
    interval_reason: str | None = Field(
        None,
        description="why the collector reads less often than every cycle (a full scan, ...): "
        "shown with its interval on the status page and by check-config",
    )
    timeout: float | None = Field(
        None, gt=0, description="statement timeout in seconds (default: statement_timeout)"
    )
    max_rows: int = Field(
        100_000,
        ge=1,
        description="rows read per run at most: the rest is never fetched (the run is counted "
        "as an error, reason too_many_rows, and serves the rows read)",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _COLLECTOR_NAME.match(name):
            raise ValueError(f"{name!r}: use letters, digits, '_', '.', '-'")
        return name

    @field_validator("query", "refuse_when")
    @classmethod
    def _query(cls, query: str | None) -> str | None:
        if query is not None and not query.strip():
            raise ValueError("the query is empty")
        return query

    @field_validator("labels")
    @classmethod
    def _label_columns(cls, columns: list[str]) -> list[str]:
        _check_label_names(dict.fromkeys(columns, ""))
        duplicates = sorted({column for column in columns if columns.count(column) > 1})
        if duplicates:
            raise ValueError(f"label column listed twice: {', '.join(duplicates)}")
        return columns

    @field_validator("static_labels")
    @classmethod
    def _static_label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        return _check_label_names(labels)

    @model_validator(mode="after")
    def _consistent(self) -> SqlCollector:
        problems = list(_problems(self))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def reads_note(self, cycle: float) -> str | None:
        """How the collector reads when that is less often than every `cycle` seconds, and why
        (the status page, check-config); None when it reads every cycle."""
        if self.interval is None or self.interval <= cycle:
            return None
        ages = " (its ages move on between reads)" if self.has_ages() else ""
        why = self.interval_reason or "its own interval"
        return f"reads every {self.interval:g}s{ages}: {why}"

    def has_ages(self) -> bool:
        """Whether a value is an age that grows between reads (SqlValue.age)."""
        return any(value.age for value in self.values)

    def specs(self) -> dict[str, MetricSpec]:
        """The metric of every value: the catalog's for built-in names, else built here."""
        specs: dict[str, MetricSpec] = {}
        for value in self.values:
            if value.metric in specs:
                continue
            builtin = BY_NAME.get(value.metric)
            specs[value.metric] = builtin or _custom_spec(self, value.metric)
        return specs


def _check_label_names(labels: dict[str, str]) -> dict[str, str]:
    bad = [name for name in labels if not _LABEL_NAME.match(name) or name.startswith("__")]
    if bad:
        raise ValueError(f"not valid label names: {', '.join(map(repr, bad))}")
    return labels


def _problems(collector: SqlCollector) -> Iterable[str]:
    label_columns = set(collector.labels)
    for column in sorted(label_columns & set(collector.static_labels)):
        yield f"label {column!r} is both a label column and a static label"
    seen_series: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    custom_types: dict[str, str] = {}
    for value in collector.values:
        where = f"value {value.column!r} ({value.metric})"
        if value.column in label_columns:
            yield f"{where}: column {value.column!r} is also a label column"
        for name in sorted(set(value.labels) & (label_columns | set(collector.static_labels))):
            yield f"{where}: label {name!r} is already set by the collector"
        series = (value.metric, frozenset(value.labels.items()))
        if series in seen_series:
            yield f"{where}: duplicate metric name {value.metric!r} with the same labels"
        seen_series.add(series)
        builtin = BY_NAME.get(value.metric)
        if builtin is not None:
            yield from _builtin_problems(collector, value, builtin, where)
            continue
        kind = value.type or "gauge"
        if custom_types.setdefault(value.metric, kind) != kind:
            yield f"{where}: declared both {custom_types[value.metric]} and {kind}"
        yield from _custom_name_problems(value.metric, kind, where)


def _builtin_problems(
    collector: SqlCollector, value: SqlValue, spec: MetricSpec, where: str
) -> Iterable[str]:
    clash = f"{where}: name clash with the built-in metric {spec.name!r}"
    if spec.origin == "self" or spec.kind == "histogram":
        yield f"{clash}, which a collector cannot write"
        return
    if value.type is not None and value.type != spec.kind:
        yield f"{clash}, a {spec.kind}; drop type: {value.type}"
    if value.help is not None:
        yield f"{clash}, whose help text is fixed; drop help"
    names = set(collector.labels) | set(collector.static_labels) | set(value.labels)
    extra = sorted(names - set(spec.labels))
    if extra:
        yield (
            f"{clash}: its labels are {', '.join(spec.labels)}; "
            f"{', '.join(extra)} is not one of them"
        )


def _custom_name_problems(name: str, kind: str, where: str) -> Iterable[str]:
    if name.startswith(RESERVED_PREFIX):
        yield f"{where}: names starting {RESERVED_PREFIX} are the exporter's own"
    if kind == "counter" and not name.endswith("_total"):
        yield f"{where}: a counter's name must end in _total"
    if kind == "gauge" and name.endswith("_total"):
        yield f"{where}: only counters end in _total (set type: counter)"


def _custom_spec(collector: SqlCollector, metric: str) -> MetricSpec:
    values = [value for value in collector.values if value.metric == metric]
    labels = list(collector.labels) + list(collector.static_labels)
    for value in values:
        labels += [name for name in value.labels if name not in labels]
    help_text = next((value.help for value in values if value.help), None)
    kind = values[0].type or "gauge"
    return MetricSpec(
        metric,
        kind,
        tuple(labels),
        help_text or f"{metric}, from SQL collector {collector.name}.",
        "sampled",
    )


def duplicate_custom_metrics(collectors: Sequence[SqlCollector]) -> list[str]:
    """Custom metrics defined by more than one collector: each must have one definition."""
    owner: dict[str, str] = {}
    problems = []
    for collector in collectors:
        for metric in sorted({value.metric for value in collector.values} - set(BY_NAME)):
            first = owner.setdefault(metric, collector.name)
            if first != collector.name:
                problems.append(
                    f"duplicate metric name {metric!r}: defined by collectors "
                    f"{first!r} and {collector.name!r}"
                )
    return problems


# A label of a series: the position of a label column in collector.labels, or a constant text.
Slot = int | str
# Value columns of these types already arrive as int or float: no conversion needed.
_NATIVE_NUMBER_OIDS = {20, 21, 23, 26, 700, 701}


@dataclass(frozen=True)
class _ValuePlan:
    spec: MetricSpec
    column: int
    slots: tuple[Slot, ...]  # one per spec.labels, in order
    count_nulls: bool
    to_float: bool  # numeric (Decimal) and boolean values are converted
    counter: bool  # its values must not be negative either
    age: bool  # grown by the seconds since the read (SqlValue.age)


class RowConverter:
    """Rows of one result shape -> samples, built once per shape.

    It works a column at a time: the rows are transposed once and every value column goes to
    the samples whole (SeriesColumns), sharing the label columns, so nothing is built per row.
    Row by row in Python, 10k Attune rows cost 3x their fetch (bench/postgres_sampling.py).
    Rows whose label values repeat are the exception: added one by one, they combine as their
    metric says.
    """

    def __init__(self, collector: SqlCollector, columns: Sequence[tuple[str, int]]) -> None:
        """`columns`: (name, type OID) of each result column, as the database described them."""
        index = {name: position for position, (name, _) in enumerate(columns)}
        _check_shape(collector, columns, index)
        self._label_columns = tuple(index[name] for name in collector.labels)
        self._text_labels = tuple(columns[i][1] in TEXT_TYPE_OIDS for i in self._label_columns)
        specs = collector.specs()
        plans = []
        for value in collector.values:
            spec = specs[value.metric]
            fixed = {**collector.static_labels, **value.labels}
            slots = tuple(
                collector.labels.index(name) if name in collector.labels else fixed.get(name, "")
                for name in spec.labels
            )
            column = index[value.column]
            to_float = columns[column][1] not in _NATIVE_NUMBER_OIDS
            counts_nulls = value.on_null == "count"
            counter = spec.kind == "counter"
            plans.append(
                _ValuePlan(spec, column, slots, counts_nulls, to_float, counter, value.age)
            )
        self._plans = tuple(plans)

    def convert(
        self, rows: Sequence[Sequence[Any]], samples: SampleSet, since_read: float = 0.0
    ) -> tuple[int, int]:
        """Add every row's values to `samples`, ages grown by `since_read` seconds (rows read
        that long ago); the number of NULL values skipped and counted, and of values refused
        (numbers.py: NaN, infinite, a negative counter)."""
        if not rows:
            return 0, 0
        columns = list(zip(*rows, strict=True))
        labels = [
            _label_texts(columns[column], is_text)
            for column, is_text in zip(self._label_columns, self._text_labels, strict=True)
        ]
        distinct = _distinct(labels, len(rows))
        nulls = refused = 0
        for plan in self._plans:
            block, skipped, unsound = _block(plan, labels, columns[plan.column], since_read)
            nulls += skipped if plan.count_nulls else 0
            refused += unsound
            if distinct:
                samples.add_columns(plan.spec, block)
                continue
            for label_values, value in block.items():
                samples.add_labelled(plan.spec, label_values, value)
        return nulls, refused


def _distinct(labels: list[tuple[str, ...]], rows: int) -> bool:
    """True when no two rows have the same label values."""
    if len(labels) == 1:
        return len(set(labels[0])) == rows
    return len(set(zip(*labels, strict=True))) == rows if labels else rows == 1


def _label_texts(column: tuple[Any, ...], is_text: bool) -> tuple[str, ...]:
    if is_text and None not in column:
        return column
    return tuple(map(_label_text, column))


def _block(
    plan: _ValuePlan, labels: list[tuple[str, ...]], column: tuple[Any, ...], since_read: float
) -> tuple[SeriesColumns, int, int]:
    """The plan's series from its value column, NULL cells and values numbers.py refuses left
    out; and how many were NULL, and refused."""
    label_columns = [labels[slot] if isinstance(slot, int) else slot for slot in plan.slots]
    values: Sequence[Any] = column
    skipped = 0
    if None in column:
        present = list(map(is_not, column, repeat(None)))
        values, label_columns = _kept(present, values, label_columns)
        skipped = len(column) - len(values)
    if plan.to_float:
        values = _floats(values)
    if plan.age and since_read > 0:
        values = [value + since_read for value in values]
    refused = 0
    if not all_finite(values, plan.counter):  # rare: checked one by one
        sound = [is_finite(value, plan.counter) for value in values]
        kept, label_columns = _kept(sound, values, label_columns)
        refused, values = len(values) - len(kept), kept
    return SeriesColumns(tuple(label_columns), values), skipped, refused


def _floats(values: Sequence[Any]) -> list[float]:
    """numeric (Decimal) and boolean values as floats; one that cannot be (a signalling NaN)
    becomes NaN, which the number check then refuses: it costs its row alone."""
    try:
        return list(map(float, values))
    except (ValueError, TypeError, OverflowError):
        return [_float_or_nan(value) for value in values]


def _float_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (ValueError, TypeError, OverflowError):
        return math.nan


def _kept(
    keep: list[bool], values: Sequence[Any], label_columns: list[Any]
) -> tuple[list[Any], list[Any]]:
    """The values and label columns of the rows to keep."""
    return list(compress(values, keep)), [
        label if isinstance(label, str) else tuple(compress(label, keep)) for label in label_columns
    ]


def _check_shape(
    collector: SqlCollector, columns: Sequence[tuple[str, int]], index: dict[str, int]
) -> None:
    wanted = [*collector.labels, *(value.column for value in collector.values)]
    missing = [name for name in wanted if name not in index]
    if missing:
        returned = ", ".join(name for name, _ in columns) or "nothing"
        raise QueryShapeError(
            f"collector {collector.name}: the query returns no column "
            f"{', '.join(map(repr, missing))} (it returns {returned})"
        )
    for value in collector.values:
        type_oid = columns[index[value.column]][1]
        if type_oid not in NUMERIC_TYPE_OIDS:
            raise QueryShapeError(
                f"collector {collector.name}: value column {value.column!r} is not numeric "
                f"(type oid {type_oid}); cast it in the query, e.g. {value.column}::float8"
            )


def _label_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):  # a type psycopg has no binary loader for (an enum, say)
        return value.decode("utf-8", "replace")
    return value if value.__class__ is str else str(value)
