"""Write docs/metrics.md and docs/presets.md from the code: the metric catalog and the presets.

.venv/bin/python scripts/generate_reference.py           # rewrite the files
.venv/bin/python scripts/generate_reference.py --check   # fail when a committed file is stale
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import types
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from exporter.config import presets
from exporter.config.settings import Config
from exporter.core.printable import printable
from exporter.lifecycle.metrics import EXEMPLIFIED
from exporter.output import catalog

ROOT = Path(__file__).resolve().parent.parent
ORIGINS = {
    "sampled": "Sampled from Redis keys and PostgreSQL",
    "events": "Derived from lifecycle events",
    "self": "The exporter's own",
}


def metrics_page() -> str:
    lines = [
        "# Metric reference",
        "",
        "Generated from `exporter/output/catalog.py` by `scripts/generate_reference.py`; do not edit.",
        "Label values absent for a series are empty strings (which Prometheus treats as absent).",
        f"`[{catalog.SOURCE_LABEL}]`: with several Redis sources (`sources.redis` a list) the",
        "family also carries this label, last: the name of the Redis the series was read from",
        '(README, "Several Redis servers"); with one Redis it is not there. Every queue and job',
        "family carries it, and so do the exporter's own series of a stream or native reader.",
        "",
        "**Exemplars**: "
        + ", ".join(f"`{name}`" for name in EXEMPLIFIED)
        + " carry the trace and span ids of a lifecycle event that had a `traceparent`",
        "(docs/events.md, *Trace context*): a histogram series the last such observation of each",
        "bucket, a counter series the last such increment. They are served in OpenMetrics (when",
        "the scraper asks for it, as Prometheus does) and over OTLP, never in the 0.0.4 text",
        "format; Prometheus keeps them with `--enable-feature=exemplar-storage`.",
        "",
    ]
    for origin, title in ORIGINS.items():
        lines += [f"## {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for spec in (spec for spec in catalog.ALL if spec.origin == origin):
            meaning = spec.help
            if spec.buckets:
                meaning += " Buckets: " + ", ".join(f"{bound:g}" for bound in spec.buckets) + "."
            labels = ", ".join(spec.labels) or "—"
            if spec.per_redis:
                labels += f", [{catalog.SOURCE_LABEL}]"
            lines.append(f"| `{spec.name}` | {spec.kind} | {labels} | {meaning} |")
        lines.append("")
    return "\n".join(lines + conventions_section())


def conventions_section() -> list[str]:
    """The OpenTelemetry messaging semantic conventions: the mapping, from catalog.CONVENTIONS."""
    renamed = ", ".join(
        f"`{ours}` → `{theirs}`" for ours, theirs in catalog.SEMCONV_ATTRIBUTES.items()
    )
    lines = [
        "## OpenTelemetry messaging semantic conventions",
        "",
        "With `messaging_conventions: true` (off by default) the families below are also served",
        f"under the names of OpenTelemetry's [messaging metrics conventions]({catalog.SEMCONV_URL}),",
        "beside (never instead of) the project's own: the same series, the same values, read from",
        "the same store at the same render or push. Their status is",
        f"**{catalog.SEMCONV_STATUS.capitalize()}** (the conventions' name for experimental): a later",
        "release of the conventions may rename them, and the project's names stay the contract.",
        "",
        f"Attributes: {renamed}; `{catalog.SEMCONV_OPERATION}` (required by the conventions) is",
        "added with the operation below; every other label (`job_type`, `priority`,",
        f"`{catalog.SOURCE_LABEL}`) is kept as it is. Over OTLP the names and attributes are dotted",
        "and the metric carries the convention's unit; on `/metrics` they are written as",
        "OpenTelemetry's Prometheus compatibility writes them: dots become underscores, the unit's",
        "suffix follows (`s`: `_seconds`; a unit in braces adds none), then `_total` on a counter.",
        "",
        "| convention (OTLP) | on /metrics | type | unit | read from | messaging.operation.name | why the same |",
        "|---|---|---|---|---|---|---|",
    ]
    for convention in catalog.CONVENTIONS:
        spec = catalog.BY_NAME[convention.source]
        prometheus = catalog.prometheus_name(convention, spec.kind)
        lines.append(
            f"| `{convention.name}` | `{prometheus}` | {spec.kind} | `{convention.unit}` "
            f"| `{spec.name}` | `{convention.operation}` | {convention.why} |"
        )
    return [
        *lines,
        "",
        "Left out, as not the same measurement:",
        "",
        "- `messaging.client.operation.duration` (a client's send or receive call):",
        "  `queue_backend_operation_seconds` times a client's enqueue and dequeue beside operations",
        "  of the queue system's own (`snapshot_write`, ...), which are no messaging operation.",
        "- `error.type`: the conventions set it on a failed operation of the families above. No",
        "  mapped family has an outcome: `queue_job_execution_seconds` holds failed attempts",
        "  beside completed ones (so `messaging.process.duration` has no `error.type` on them),",
        "  and failures by class (`queue_jobs_failed_total`'s `error_type`) have no convention of",
        "  their own to go to.",
        "- Queue depth, ages, workers and the rest: the conventions define no such metric.",
        "",
        "`messaging.process.duration` keeps the buckets of `queue_job_execution_seconds` (so its",
        "buckets equal ours; `sources.events.histogram_buckets` changes both), not the advised",
        "boundaries of the conventions (0.005 to 10 s), which would cut off jobs that run minutes.",
        "Its buckets carry the exemplars of ours (the same trace on the same bucket).",
        "",
        "The OTLP push's resource is the OpenTelemetry SDK's (`Resource.create`): the attributes of",
        "`OTEL_RESOURCE_ATTRIBUTES` (the chart sets `k8s.pod.name` and `k8s.namespace.name` there",
        "from the downward API), `service.name` from `OTEL_SERVICE_NAME` or that variable, else",
        "`otlp.service_name` (`queue-exporter`), and `service.version`.",
        "",
    ]


def presets_page() -> str:
    lines = [
        "# Presets",
        "",
        "Generated from `exporter/config/presets/*.yaml` by `scripts/generate_reference.py`; do not edit.",
        "A preset is a piece of configuration: `--preset NAME`, or in the file",
        "`presets: [{name: NAME, params: {...}}]` to override its params. Key groups use the same",
        "format as an operator's own (`sources.redis.key_groups`, see the README).",
        "",
        "On the command line and in `QUEUE_EXPORTER_PRESET` (presets apart by spaces) params",
        "follow the name in one string, `NAME:PARAM=VALUE;PARAM=VALUE`:",
        "`--preset 'celery:queues=a,b;native=false'`. A value takes the type of the param's",
        "default: a list is split at commas (`queues=` is the empty list), a boolean is",
        "true/false (yes/no, on/off, 1/0), a number a number; a value starting with `[`, `{` or",
        '`"` is read as YAML (`sep="\\x06\\x16"`, `priorities={1: low, 2: high}`). An',
        "unknown param or a value of the wrong type is refused as in the file, naming the",
        "nearest param (`unknown params queus (did you mean 'queues'?`).",
        "A preset that configures `sources.native` also reads the system's own records into",
        "throughput, failures, runtimes and workers: docs/native.md says what each reader reads,",
        "which versions are tested, and how to add a reader.",
        "",
        "Each preset's **Queues found** line says where its queues come from: a set or the keys",
        "the system itself keeps per queue (every queue, an empty one reading 0), a param that",
        "lists them (only those: where the system records no list of its queues), or a SCAN of",
        "the queue keys (a queue whose key Redis deleted when it emptied is absent until it holds",
        "a job again). A `select` (the celery preset's `queues` param) narrows or adds to what is",
        "found, and a queue found but left out is named in the log, on the status page and by",
        "check-config.",
        "",
        "Each preset's **Not recorded** list names the signals operators page on (waiting,",
        "running, failed jobs kept, oldest waiting and longest running ages, completed, failed,",
        "retried, workers, slots: `exporter/output/catalog.py` SIGNALS) that its system does not record,",
        "and why: nothing serves them, no value is made up in their place, and the exporter's",
        "log, status page and check-config name them (the preset's `not_recorded`). Every other",
        "signal is served, which the conformance harness checks against the real library",
        "(tests/conformance). docs/alerts.md says which alert can fire for which system.",
        "",
    ]
    for name in presets.available():
        document = presets.read(name)
        lines += [f"## `{name}`", "", presets.describe(name), ""]
        params = document.get("params") or {}
        if params:
            lines.append(
                "Params: " + ", ".join(f"`{k}` (default `{_shown(v)}`)" for k, v in params.items())
            )
            lines.append("")
        lines += _library_lines(document.get("library"))
        lines += _not_recorded_lines(document.get("not_recorded", {}).get(name, {}))
        groups = document.get("sources", {}).get("redis", {}).get("key_groups", [])
        if groups:
            expanded = (
                presets.expand(name).get("sources", {}).get("redis", {}).get("key_groups", [])
            )
            lines += [f"Queues found: {_queues_found(groups, expanded)}.", ""]
            lines += ["| key pattern | type | state | reads |", "|---|---|---|---|"]
            lines += [_group_row(group) for group in groups]
            lines.append("")
        for section in sorted(set(document.get("sources", {})) - {"redis"}):
            lines += [f"It also configures `sources.{section}` (see docs/{section}.md).", ""]
    return "\n".join(lines)


def _queues_found(groups: list[dict[str, Any]], expanded: list[dict[str, Any]]) -> str:
    """Where a preset's key groups take their queues from, in words, each way once (params
    named from the file, patterns as the defaults make them)."""
    ways: list[str] = []
    for group, resolved in zip(groups, expanded, strict=True):
        if "queue" in group.get("labels", {}):
            continue
        for way in _ways(group, resolved):
            if way not in ways:
                ways.append(way)
    ways.sort(key=lambda way: way.startswith("narrowed"))  # last: it narrows every way found
    return "; ".join(ways) or "named in its key patterns"


def _ways(group: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    ways = []
    listed = group.get("values", {}).get("queue")
    if isinstance(listed, str) and listed.startswith("${"):
        ways.append(f"listed in the `{listed[2:-1]}` param")
    elif listed:
        ways.append(f"listed: {listed}")
    members = resolved.get("values_from_set", {}).get("queue")
    if members is not None:
        kind = "every set matching" if "{_" in members["key"] else "the set"
        ways.append(f"the members of {kind} `{_escaped(members['key'])}`")
    keys = resolved.get("values_from_keys", {}).get("queue")
    for pattern in [keys] if isinstance(keys, str) else keys or []:
        ways.append(f"the keys `{_escaped(pattern)}`")
    split = group.get("split_by") or {}
    if split.get("label") == "queue":
        ways.append(f"each job's `{split['field']}` field (the jobs of every queue in one key)")
    select = group.get("select", {}).get("queue")
    if isinstance(select, str) and select.startswith("${"):
        ways.append(f"narrowed or added to by the `{select[2:-1]}` param")
    if not ways and "{queue}" in group["pattern"]:
        ways.append("a SCAN of the key patterns below (an emptied queue is absent)")
    return ways


def _escaped(text: str) -> str:
    """Control characters as escapes (Celery's \\x06\\x16 separator)."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _library_lines(library: dict[str, Any] | None) -> list[str]:
    """Versions tested and the table: what the library holds -> metric and labels, versions."""
    if not library:
        return []
    lines = [f"Tested with {library['tested']}.", ""]
    lines += ["| the library holds | served as | versions |", "|---|---|---|"]
    lines += [
        f"| {holds} | {served} | {versions} |" for holds, served, versions in library["holds"]
    ]
    return [*lines, ""]


def _not_recorded_lines(signals: dict[str, str]) -> list[str]:
    """The signals (exporter.output.catalog.SIGNALS) the system does not record: no series, and why."""
    if not signals:
        return []
    lines = [
        "Not recorded by the system, so never served (the status page and check-config "
        "name them too):",
        "",
    ]
    lines += [f"- {name} ({catalog.SIGNAL_WHAT[name]}): {why}" for name, why in signals.items()]
    return [*lines, ""]


def _group_row(group: dict[str, Any]) -> str:
    reads = _reads(group)
    for key_type, options in group.get("by_type", {}).items():  # a group of several types
        reads = [*reads[:-1], f"{reads[-1]}; its {key_type} keys: {', '.join(_reads(options))}"]
    # ${param|pattern} (the param as literal text of the pattern) reads as ${param} here
    pattern = repr(group["pattern"].replace("|pattern}", "}"))[1:-1].replace("|", "\\|")
    types = group["type"]
    shown = " or ".join(types) if isinstance(types, list) else types
    return f"| `{pattern}` | {shown} | {group['state']} | {', '.join(reads)} |"


def _reads(group: dict[str, Any]) -> list[str]:
    """What a group's options read, in words (a group of several types: one type's)."""
    reads = ["depth"]
    if group.get("split_by"):
        split = group["split_by"]
        score = {"as_is": "score", "negated": "score, negated"}.get(split.get("score"))
        source = f"each member's {score}" if score else f"each item's `{split['field']}`"
        reads = [f"depth per {split['label']} ({source})"]
    consumers = group.get("stream_group")
    if consumers:
        reads = [f"depth: consumer group `{consumers}`'s lag, `active`: its pending entries"]
    if group.get("priority_bands"):
        reads.append("priority from score bands")
    if group.get("scores"):
        window = group["scores"]["window"]
        reads = [
            {
                "due": "depth of scores up to now",
                "ahead": "depth of scores after now",
                "positive": "depth of scores above 0",
            }[window]
        ]
    marker = group.get("marker")
    if marker:
        checked = marker.get("max_items", 1000)
        reads.append(
            f"`{marker['state']}`: of the first {checked}, those whose `{marker['key']}` exists"
        )
    oldest = group.get("oldest")
    if oldest:
        where = oldest.get("field") or oldest["time_in"]
        unmarked = ", unmarked" if marker else ""
        end = "first undelivered" if consumers else oldest.get("end", "head")
        reads.append(f"head age ({end}{unmarked}, {where})")
    if group.get("due"):
        reads.append(f"`{group['due']['metric']}`")
    if group.get("look_alikes"):
        member_key = group["look_alikes"]["member_key"]
        reads.append(f"names keys left out whose first member's `{member_key}` exists")
    if group.get("max_depth") is not None:
        reads.append("`queue_max_depth`")
    return reads


def configuration_page() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the typed configuration models by `scripts/generate_reference.py`; do not",
        "edit. `queue-exporter check-config FILE` validates a file; `--show-config` prints it with",
        "defaults filled in and secrets masked. `[]` marks a list of entries.",
        "",
        "| setting | type | default | meaning |",
        "|---|---|---|---|",
    ]
    lines += _setting_rows(Config, "")
    return "\n".join(lines) + "\n"


def _setting_rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        layouts = _layouts(field.annotation)
        if layouts:
            rows += _layout_rows(layouts, f"{prefix}{name}[].")
        else:
            rows += _field_rows(field, f"{prefix}{name}")
    return rows


def _layouts(annotation: object) -> list[type[BaseModel]]:
    """The models of a list of a tagged union of models (a key group's layouts), else []."""
    if typing.get_origin(annotation) is not list:
        return []
    (item,) = typing.get_args(annotation)
    if typing.get_origin(item) is not typing.Annotated:
        return []
    members = typing.get_args(typing.get_args(item)[0])
    models = [typing.get_args(member)[0] for member in members]
    return models if all(isinstance(m, type) and issubclass(m, BaseModel) for m in models) else []


def _layout_rows(layouts: list[type[BaseModel]], prefix: str) -> list[str]:
    """The settings every layout has (their common base's), then each setting some layouts
    add, marked with the types whose layouts take it."""
    base = next(c for c in layouts[0].__mro__ if all(issubclass(m, c) for m in layouts))
    rows = [row for name, f in base.model_fields.items() for row in _field_rows(f, prefix + name)]
    taken: dict[str, list[type[BaseModel]]] = {}
    for layout in layouts:
        for name in layout.model_fields.keys() - base.model_fields.keys():
            taken.setdefault(name, []).append(layout)
    for name, models in sorted(taken.items(), key=lambda item: _first_place(item[0], layouts)):
        tags = [_type_tag(model) for model in models]
        note = "type " + (
            " or ".join(tags) if len(tags) < 3 else f"{', '.join(tags[:-1])} or {tags[-1]}"
        )
        rows += _field_rows(models[0].model_fields[name], prefix + name, note)
    return rows


def _first_place(name: str, layouts: list[type[BaseModel]]) -> tuple[int, int]:
    """Where a setting first appears among the layouts: the one, and its place there."""
    return next(
        (at, list(layout.model_fields).index(name))
        for at, layout in enumerate(layouts)
        if name in layout.model_fields
    )


def _type_tag(layout: type[BaseModel]) -> str:
    """The type a layout is told by: list, zset, ...; or a list of types."""
    values = typing.get_args(layout.model_fields["type"].annotation)
    return values[0] if len(values) == 1 and isinstance(values[0], str) else "a list of types"


def _field_rows(field: FieldInfo, path: str, note: str = "") -> list[str]:
    """A setting's row, or a section's rows (a model it holds: its own settings); `note`
    (which layouts take it) leads its meaning."""
    rows = []
    nested = _nested_model(field.annotation)
    default = field.default
    if default is PydanticUndefined:
        shown = "required" if field.default_factory is None else "—"
    elif isinstance(default, BaseModel) or default is None:
        shown = "—"
    else:
        secret = getattr(default, "get_secret_value", None)
        shown = f"`{secret() if secret else default}`"
    meaning = (field.description or "").replace("|", "\\|")
    if note:
        meaning = f"{note}: {meaning}" if meaning else note
    if nested is None:
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {shown} | {meaning} |")
    else:
        model_type, is_list = nested
        if default is None and meaning:  # an optional section: what unset means
            rows.append(
                f"| `{path}` | section | unset | {meaning}; the defaults below apply once "
                "the section is set |"
            )
        rows += _setting_rows(model_type, f"{path}[]." if is_list else f"{path}.")
    return rows


def _nested_model(annotation: object) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds (directly, optionally, or as a list of them). One model or a
    list of it (sources.redis) is shown by the one model's settings."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _nested_model(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return _nested_model(members[0])
        found = {_nested_model(member) for member in members}
        models = {model for model, _ in found if model is not None} if None not in found else ()
        if len(models) == 1:
            return models.pop(), False
    return None


def _type_name(annotation: object) -> str:
    text = (
        str(annotation)
        if typing.get_origin(annotation)
        else getattr(annotation, "__name__", str(annotation))
    )
    for noise in (
        "typing.",
        "pydantic.types.",
        "pathlib.",
        "exporter.sources.redis_keys.groups.",
        "NoneType",
    ):
        text = text.replace(noise, "None" if noise == "NoneType" else "")
    return text.replace("|", "or")


PAGES = {
    "docs/metrics.md": metrics_page,
    "docs/presets.md": presets_page,
    "docs/configuration.md": configuration_page,
}


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for relative, render in PAGES.items():
        path = ROOT / relative
        text = render()
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(relative)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run scripts/generate_reference.py): " + ", ".join(stale))
        return 1
    return 0


def _shown(value: Any) -> str:
    """A param's default as a person reads it: Celery's separator `\\x06\\x16`, not bytes no
    one sees."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return (
            "["
            + ", ".join(repr(printable(v)) if isinstance(v, str) else repr(v) for v in value)
            + "]"
        )
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
