"""The live status page at / and the same facts at /status.json.

An operator's first question is "is it looking at the right things?": the page answers it
from what the exporter serves right now, read where /metrics reads it, never from the /metrics
text: sources and key groups from the HealthBoard, the top queues from the sampled series in
the metrics store (as served: a snapshot past its lease is not shown), streams, errors and the
leader from the exporter's own instruments as their registry collects them (structured
samples, so any key or label value, CR, NUL or undecodable bytes included, is data, not
syntax).

One document is built at most once per CACHE_SECONDS and shared by every request meanwhile:
clients polling /status.json in a loop cost one build a second, however many they are, so
they cannot slow /metrics down (test_status_page_polling_does_not_slow_metrics measures it).

The HTML is complete without JavaScript (server-rendered, every value escaped: queue names
and keys are data anyone with write access to Redis chose). A small inline script refreshes
it from /status.json, writing text nodes only. Both render one view: the warnings and tables
built here, so the columns are defined once.
"""

from __future__ import annotations

import heapq
import html
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.core.printable import printable
from exporter.output.catalog import BY_NAME, SIGNAL_WHAT, SOURCE_LABEL, MetricSpec
from exporter.output.health import HealthBoard, KeyGroupReport, SourceStatus
from exporter.output.samples import Series
from exporter.sources.streams.config import CONSUMER_PREFIX, stream_name

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

TOP_QUEUES = 10
REFRESH_SECONDS = 5
CACHE_SECONDS = 1.0
_QUEUE_COLUMNS = ["system", "queue", "priority", "state"]
# Kept history, not work waiting: left out of the top queues (they are still on /metrics).
_HISTORY_STATES = ("completed", "failed")


@dataclass(frozen=True)
class Table:
    id: str
    title: str
    columns: list[str]
    rows: list[list[str]]


class StatusPage:
    def __init__(
        self,
        health: HealthBoard,
        own_samples: Callable[[], list[Sample]],
        sampled: Callable[[], dict[MetricSpec, Series]],
        not_recorded: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """`own_samples` returns the exporter's own instruments' samples (Telemetry.own_samples),
        `sampled` the sampled series as served, `not_recorded` the configuration's signals each
        system does not record, and why."""
        self.health = health
        self.own_samples = own_samples
        self.sampled = sampled
        self.not_recorded = [
            {"system": system, "signal": name, "why": why}
            for system, signals in sorted((not_recorded or {}).items())
            for name, why in signals.items()
        ]
        self._lock = threading.Lock()  # one build at a time; the others wait and share it
        self._built: tuple[float, dict[str, Any], bytes, bytes] | None = None

    def json(self) -> bytes:
        return self._cached()[2]

    def html(self) -> bytes:
        return self._cached()[3]

    def _cached(self) -> tuple[float, dict[str, Any], bytes, bytes]:
        """The document with its JSON and HTML, built again when CACHE_SECONDS old."""
        with self._lock:
            built = self._built
            if built is None or time.monotonic() - built[0] >= CACHE_SECONDS:
                document = self.document()
                # ensure_ascii escapes what is not UTF-8 (lone surrogates) as \u escapes; the
                # HTML writes it as backslash escapes instead of failing to encode it.
                body = json.dumps(document).encode()
                page = render_html(document).encode("utf-8", "backslashreplace")
                built = self._built = (time.monotonic(), document, body, page)
            return built

    def document(self) -> dict[str, Any]:
        """The facts for scripts, and under "view" the page's warnings and tables."""
        now = time.time()
        samples = self.own_samples()
        sampled = self.sampled()
        statuses = self.health.snapshot()
        facts: dict[str, Any] = {
            "version": __version__,
            "generated_at": now,
            "ready": self.health.ready(),
            "leader": _leader(samples),
            "sources": _sources(statuses, samples),
            "key_groups": [asdict(report) for report in self.health.key_groups()],
            "top_depth": _top(sampled, "queue_depth"),
            "top_oldest_age": _top(sampled, "queue_oldest_age_seconds"),
            "streams": _streams(samples),
            "overflow": _by_label(samples, "queue_exporter_series_overflow_total", "metric"),
            "not_recorded": self.not_recorded,
        }
        facts["view"] = {
            "summary": _summary(facts),
            "warnings": _warnings(facts, self.health.key_groups()),
            "tables": [asdict(table) for table in _tables(facts, now)],
        }
        return facts


# -- facts from the exporter's own instruments -------------------------------------------------


def _named(samples: Iterable[Sample], name: str) -> Iterable[Sample]:
    return (sample for sample in samples if sample.name == name)


def _leader(samples: list[Sample]) -> bool | None:
    values = [sample.value for sample in _named(samples, "queue_exporter_leader")]
    return bool(values[0]) if values else None


def _by_label(samples: list[Sample], name: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for sample in _named(samples, name):
        key = sample.labels.get(label, "")
        totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def _sources(statuses: dict[str, SourceStatus], samples: list[Sample]) -> list[dict[str, Any]]:
    errors: dict[str, dict[str, float]] = {}
    for sample in _named(samples, "queue_exporter_source_errors_total"):
        by_reason = errors.setdefault(sample.labels["source"], {})
        reason = sample.labels["reason"]
        by_reason[reason] = by_reason.get(reason, 0.0) + sample.value
    return [
        {"name": name, **asdict(status), "errors": errors.get(name, {})}
        for name, status in sorted(statuses.items())
    ]


def _top(sampled: dict[MetricSpec, Series], name: str) -> list[dict[str, Any]]:
    # With several Redis sources the family carries redis_source too: found by its name.
    spec = next((spec for spec in sampled if spec.name == name), BY_NAME[name])
    series = sampled.get(spec, Series(()))
    state = spec.labels.index("state")
    waiting = (item for item in series.items() if item[0][state] not in _HISTORY_STATES)
    top = heapq.nlargest(TOP_QUEUES, waiting, key=lambda item: (item[1], item[0]))
    return [
        {**dict(zip(spec.labels, labels, strict=True)), "value": value} for labels, value in top
    ]


def _streams(samples: list[Sample]) -> list[dict[str, Any]]:
    """A row per stream and group; with several Redis sources two servers' streams of one key
    are two rows, told apart by their redis_source (None with one Redis)."""
    lost = _by_stream(samples, "queue_exporter_events_lost_total")
    invalid = _by_stream(samples, "queue_exporter_events_invalid_total")
    consumed = _by_stream(samples, "queue_exporter_events_total")
    pending = {
        (*_stream_of(s), s.labels["group"]): s.value
        for s in _named(samples, "queue_exporter_stream_pending")
    }
    streams = []
    for sample in _named(samples, "queue_exporter_stream_lag"):
        stream, group = _stream_of(sample), sample.labels["group"]
        streams.append(
            {
                "stream": stream[0],
                "redis_source": stream[1],
                "name": stream_name(*stream),
                "group": group,
                "lag": sample.value,
                "pending": pending.get((*stream, group)),
                "lost": lost.get(stream, 0.0),
                "invalid": invalid.get(stream, 0.0),
                "consumed": consumed.get(stream, 0.0),
            }
        )
    return streams


def _stream_of(sample: Sample) -> tuple[str, str | None]:
    """A stream self-metric's stream key and Redis (redis_source, absent with one Redis)."""
    return sample.labels["stream"], sample.labels.get(SOURCE_LABEL)


def _by_stream(samples: list[Sample], name: str) -> dict[tuple[str, str | None], float]:
    totals: dict[tuple[str, str | None], float] = {}
    for sample in _named(samples, name):
        stream = _stream_of(sample)
        totals[stream] = totals.get(stream, 0.0) + sample.value
    return totals


# -- the view: what the page shows, in plain words -----------------------------------------------


def _summary(facts: dict[str, Any]) -> str:
    state = "ready" if facts["ready"] else "NOT READY"
    leader = {True: ", leader", False: ", follower (another replica samples)", None: ""}
    return f"queue-exporter {facts['version']}: {state}{leader[facts['leader']]}"


def _warnings(facts: dict[str, Any], key_groups: list[KeyGroupReport]) -> list[str]:
    warnings = []
    if any(source["lease_down"] for source in facts["sources"]):
        warnings.append(
            "no replica can hold the leader lease: the sampled sources are down on this "
            "replica and no queue series are served (see the lease error below)"
        )
    for source in facts["sources"]:
        if source["standby"] or source["up"]:
            continue
        if source["last_error"] is None:
            warnings.append(f"source {source['name']} has not finished its first cycle yet")
        else:
            warnings.append(
                f"source {source['name']} cannot be read ({source['last_error']}): "
                "its series are withdrawn until it answers again"
            )
    for source in facts["sources"]:
        if source.get("silent") and source["up"]:
            warnings.append(f"source {source['name']} hears nothing: {source['silent']}")
        if source.get("caveat") and source["up"]:
            warnings.append(f"source {source['name']}: {source['caveat']}")
    for report in key_groups:
        if report.last_warning is not None:
            warnings.append(
                f"key group {printable(report.pattern)} ({report.system}, {report.type}): "
                f"{report.last_warning}"
            )
    reported = {CONSUMER_PREFIX + stream["name"] for stream in facts["streams"]}
    for source in facts["sources"]:
        if source["name"].startswith(CONSUMER_PREFIX) and source["name"] not in reported:
            warnings.append(
                f"stream {source['name'].removeprefix(CONSUMER_PREFIX)} has reported no lag "
                "yet: does the stream exist? (nothing is consumed until a producer writes it)"
            )
    for stream in facts["streams"]:
        if stream["lost"]:
            warnings.append(
                f"stream {printable(stream['name'])}: {stream['lost']:g} events were trimmed "
                "before the group read them"
            )
        if stream["invalid"]:
            warnings.append(
                f"stream {printable(stream['name'])}: {stream['invalid']:g} events refused"
            )
    for metric, count in sorted(facts["overflow"].items()):
        warnings.append(
            f"{metric}: {count:g} label sets folded into __overflow__ "
            "(limits.max_series_per_metric)"
        )
    return warnings


def _tables(facts: dict[str, Any], now: float) -> list[Table]:
    return [
        Table(
            "sources",
            "Sources",
            ["source", "state", "last sample", "duration", "errors"],
            [_source_row(source, now) for source in facts["sources"]],
        ),
        Table(
            "key-groups",
            "Key groups (last cycle)",
            ["system", "pattern", "type", "keys matched", "queues", "series", "errors"],
            [
                [
                    group["system"],
                    printable(group["pattern"]),
                    group["type"],
                    str(group["keys_matched"]),
                    str(group["queues"]),
                    str(group["series"]),
                    _counts(group["errors"]),
                ]
                for group in facts["key_groups"]
            ],
        ),
        _queue_table("top-depth", "Deepest queues", "depth", facts["top_depth"], "{:g}"),
        _queue_table(
            "top-age", "Oldest waiting items", "oldest age", facts["top_oldest_age"], "{:.0f}s"
        ),
        Table(
            "streams",
            "Event streams",
            ["stream", "group", "lag", "pending", "lost", "invalid", "consumed"],
            [
                [printable(stream["name"]), printable(stream["group"])]
                + [_number(stream[field]) for field in ("lag", "pending", "lost", "invalid")]
                + [_number(stream["consumed"])]
                for stream in facts["streams"]
            ],
        ),
        Table(
            "not-recorded",
            "Signals the systems do not record (no series: never made up)",
            ["system", "signal", "what", "why"],
            [
                [entry["system"], entry["signal"], SIGNAL_WHAT[entry["signal"]], entry["why"]]
                for entry in facts["not_recorded"]
            ],
        ),
    ]


def _source_row(source: dict[str, Any], now: float) -> list[str]:
    if source["standby"]:
        state = "standby (follower)"
    elif source["up"]:
        state = f"up; {source['reads']}" if source.get("reads") else "up"
    else:
        state = f"down: {source['last_error'] or 'first cycle not finished'}"
    last = source["last_success"]
    duration = source["last_duration"]
    return [
        source["name"],
        state,
        f"{max(now - last, 0):.0f}s ago" if last is not None else "never",
        f"{duration:.3f}s" if duration is not None else "",
        _counts(source["errors"]),
    ]


def _queue_table(
    table_id: str, title: str, column: str, entries: list[dict[str, Any]], fmt: str
) -> Table:
    rows = [
        [printable(entry[label]) for label in _QUEUE_COLUMNS] + [fmt.format(entry["value"])]
        for entry in entries
    ]
    return Table(table_id, title, [*_QUEUE_COLUMNS, column], rows)


def _counts(counts: dict[str, float]) -> str:
    return ", ".join(f"{reason} {count:g}" for reason, count in sorted(counts.items()))


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


# -- HTML --------------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1a1a1a}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f2f2f2}td.none{color:#777;font-style:italic}
#warnings li{color:#8a1c00}nav a{margin-right:1em}
"""

# Writes text nodes only (textContent): values are never parsed as HTML.
_SCRIPT = """
(function () {
  function cell(tag, text, cls) {
    var node = document.createElement(tag);
    node.textContent = text;
    if (cls) { node.className = cls; }
    return node;
  }
  function rows(table) {
    if (!table.rows.length) {
      var empty = cell("td", "none", "none");
      empty.colSpan = table.columns.length;
      var tr = document.createElement("tr");
      tr.appendChild(empty);
      return [tr];
    }
    return table.rows.map(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (value) { tr.appendChild(cell("td", value)); });
      return tr;
    });
  }
  function render(view) {
    document.getElementById("summary").textContent = view.summary;
    var list = document.getElementById("warnings-list");
    list.replaceChildren.apply(list, view.warnings.length
      ? view.warnings.map(function (w) { return cell("li", w); }) : [cell("li", "none")]);
    view.tables.forEach(function (table) {
      var body = document.querySelector("#" + table.id + " tbody");
      body.replaceChildren.apply(body, rows(table));
    });
    document.body.setAttribute("data-refreshed", new Date().toISOString());
  }
  function refresh() {
    fetch("status.json", {credentials: "same-origin", cache: "no-store"})
      .then(function (response) { return response.json(); })
      .then(function (status) { render(status.view); })
      .catch(function () {});
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
"""


def render_html(document: dict[str, Any]) -> str:
    view = document["view"]
    warnings = view["warnings"] or ["none"]
    parts = [
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
        "<title>queue-exporter status</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<h1>queue-exporter</h1><p id="summary">{html.escape(view["summary"])}</p>',
        '<nav><a href="metrics">/metrics</a><a href="status.json">/status.json</a>'
        '<a href="healthz">/healthz</a><a href="readyz">/readyz</a></nav>',
        '<section id="warnings"><h2>Warnings</h2><ul id="warnings-list">',
        *(f"<li>{html.escape(warning)}</li>" for warning in warnings),
        "</ul></section>",
        *(_table_html(Table(**table)) for table in view["tables"]),
        f"<script>{_SCRIPT.replace('REFRESH_MS', str(REFRESH_SECONDS * 1000))}</script>",
        "</body></html>\n",
    ]
    return "".join(parts)


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(column)}</th>" for column in table.columns)
    if table.rows:
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(value)}</td>" for value in row) + "</tr>"
            for row in table.rows
        )
    else:
        body = f'<tr><td class="none" colspan="{len(table.columns)}">none</td></tr>'
    return (
        f'<section id="{table.id}"><h2>{html.escape(table.title)}</h2>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>"
    )
