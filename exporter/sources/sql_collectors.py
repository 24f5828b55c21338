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

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporter.catalog import BY_NAME, MetricSpec
from exporter.samples import LabelValues, SampleSet

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


class SqlValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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


class SqlCollector(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the source is named postgres:<name>")
    query: str = Field(description="one read-only statement")
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
    timeout: float | None = Field(
        None, gt=0, description="statement timeout in seconds (default: statement_timeout)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _COLLECTOR_NAME.match(name):
            raise ValueError(f"{name!r}: use letters, digits, '_', '.', '-'")
        return name

    @field_validator("query")
    @classmethod
    def _query(cls, query: str) -> str:
        if not query.strip():
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
    column: int
    slots: tuple[Slot, ...]  # one per spec.labels, in order
    count_nulls: bool
    to_float: bool  # numeric (Decimal) and boolean values are converted


@dataclass(frozen=True)
class _MetricPlan:
    spec: MetricSpec
    values: tuple[_ValuePlan, ...]
    # The values' series cannot share a key (a constant label tells them apart): one dict.
    disjoint: bool


class RowConverter:
    """Rows of one result shape -> samples, built once per shape.

    It works a column at a time: the rows are transposed once, each label layout's keys are
    zipped once and shared by the values that use it, and each metric's series are built in
    one dict(zip(...)). That keeps the per-value work in C: row by row in Python, 10k Attune
    rows cost 3x their fetch (bench/postgres_sampling.py).
    """

    def __init__(self, collector: SqlCollector, columns: Sequence[tuple[str, int]]) -> None:
        """`columns`: (name, type OID) of each result column, as the database described them."""
        index = {name: position for position, (name, _) in enumerate(columns)}
        _check_shape(collector, columns, index)
        self._label_columns = tuple(index[name] for name in collector.labels)
        self._text_labels = tuple(columns[i][1] in TEXT_TYPE_OIDS for i in self._label_columns)
        specs = collector.specs()
        by_metric: dict[str, list[_ValuePlan]] = {}
        for value in collector.values:
            fixed = {**collector.static_labels, **value.labels}
            slots = tuple(
                collector.labels.index(name) if name in collector.labels else fixed.get(name, "")
                for name in specs[value.metric].labels
            )
            column = index[value.column]
            plan = _ValuePlan(
                column,
                slots,
                value.on_null == "count",
                columns[column][1] not in _NATIVE_NUMBER_OIDS,
            )
            by_metric.setdefault(value.metric, []).append(plan)
        self._metrics = tuple(
            _MetricPlan(specs[metric], tuple(plans), _disjoint(plans))
            for metric, plans in by_metric.items()
        )

    def convert(self, rows: Sequence[Sequence[Any]], samples: SampleSet) -> int:
        """Add every row's values to `samples`; the number of NULL values skipped and counted."""
        if not rows:
            return 0
        columns = list(zip(*rows, strict=True))
        labels = [
            _label_texts(columns[column], is_text)
            for column, is_text in zip(self._label_columns, self._text_labels, strict=True)
        ]
        keys_by_slots: dict[tuple[Slot, ...], list[LabelValues]] = {}
        nulls = 0
        for metric in self._metrics:
            parts: list[tuple[Sequence[LabelValues], Sequence[float]]] = []
            for plan in metric.values:
                all_keys = keys_by_slots.get(plan.slots)
                if all_keys is None:
                    all_keys = keys_by_slots[plan.slots] = _keys(plan.slots, labels, len(rows))
                keys, values, skipped = _present(all_keys, columns[plan.column], plan.to_float)
                nulls += skipped if plan.count_nulls else 0
                parts.append((keys, values))
            if metric.disjoint:
                parts = [_chained(parts)]
            for keys, values in parts:
                samples.add_series(metric.spec, _series(metric.spec, keys, values))
        return nulls


def _disjoint(plans: list[_ValuePlan]) -> bool:
    """True when some label is a different constant for each plan (state: pending / active)."""
    if len(plans) == 1:
        return True
    for position in range(len(plans[0].slots)):
        constants = [plan.slots[position] for plan in plans]
        if all(isinstance(c, str) for c in constants) and len(set(constants)) == len(plans):
            return True
    return False


def _label_texts(column: tuple[Any, ...], is_text: bool) -> tuple[str, ...]:
    if is_text and None not in column:
        return column
    return tuple(map(_label_text, column))


def _keys(slots: tuple[Slot, ...], labels: list[tuple[str, ...]], rows: int) -> list[LabelValues]:
    if not slots:
        return [()] * rows
    parts = [labels[slot] if isinstance(slot, int) else repeat(slot, rows) for slot in slots]
    return list(zip(*parts))  # noqa: B905 (repeat is endless; the label columns set the length)


def _present(
    keys: list[LabelValues], column: tuple[Any, ...], to_float: bool
) -> tuple[Sequence[LabelValues], Sequence[float], int]:
    """Keys and values of the non-NULL cells, and how many were NULL."""
    values: Sequence[Any] = column
    skipped = 0
    if None in column:
        present = list(map(is_not, column, repeat(None)))
        keys, values = list(compress(keys, present)), list(compress(column, present))
        skipped = len(column) - len(keys)
    if to_float:
        values = list(map(float, values))
    return keys, values, skipped


def _chained(
    parts: list[tuple[Sequence[LabelValues], Sequence[float]]],
) -> tuple[Sequence[LabelValues], Sequence[float]]:
    if len(parts) == 1:
        return parts[0]
    keys = list(chain.from_iterable(part_keys for part_keys, _ in parts))
    values = list(chain.from_iterable(part_values for _, part_values in parts))
    return keys, values


def _series(
    spec: MetricSpec, keys: Sequence[LabelValues], values: Sequence[float]
) -> dict[LabelValues, float]:
    series = dict(zip(keys, values, strict=True))
    if len(series) < len(keys):  # rows that share label values combine as the metric says
        combined = SampleSet()
        for key, value in zip(keys, values, strict=True):
            combined.add_labelled(spec, key, value)
        series = dict(next(combined.metrics())[1])
    return series


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
