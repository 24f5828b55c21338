"""Prometheus text (0.0.4) and OpenMetrics (1.0.0) written straight from the store's families.

Why not prometheus_client's writers: they check every label name of every sample and build a
Sample and a dict per series per scrape. 75k series took 0.95 s that way; here a line is one
`%` format per series, with a format made once per family (bench/exposition.py has the
figures against prometheus_client and a plain text writer).

Escaping without a cost per label value: lines are written a chunk at a time without escaping,
then the chunk is checked. A chunk of n lines whose k label values per line hold no quote,
backslash or newline has exactly 2*k*n quotes, n newlines and no backslash; any such character
in a value breaks that count, and the chunk is written again with every value escaped.
Values are checked the same way, by their sum: a sum that is not finite sends the chunk to the
careful writer, which spells +Inf, -Inf and NaN as both formats want.

Chunks keep memory flat: a few thousand lines are joined and encoded at a time, so what stays
is the encoded body, not a string per line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, islice
from operator import itemgetter
from typing import Any, cast

from exporter.samples import Series, flat_rows
from exporter.store import Family, HistogramFamily, NumberFamily

# The formats' media types, as prometheus_client names them (CONTENT_TYPE_PLAIN_0_0_4 and the
# OpenMetrics CONTENT_TYPE_LATEST, tests/test_exposition.py): spelled here, since serve answers
# its first scrapes before prometheus_client loads (exporter/self_metrics.py).
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS_EOF = b"# EOF\n"  # the end of an OpenMetrics exposition, after every family
CHUNK = 2048  # lines joined at a time
_LABELS = "\x00"  # where a histogram template takes a series' labels (never in a name or bound)
_last = itemgetter(-1)


def render(families: Iterable[Family], openmetrics: bool) -> list[bytes]:
    """The exposition of these families, as encoded chunks (without OpenMetrics' `# EOF`)."""
    out: list[bytes] = []
    for family in families:
        spec = family.spec
        out.append(_header(spec.name, spec.help, spec.kind, openmetrics))
        if isinstance(family, NumberFamily):
            _write_numbers(out, spec.name, spec.labels, family.series)
        else:
            _write_histogram(out, family)
    return out


def content_type(openmetrics: bool) -> str:
    return OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE


def _header(name: str, help: str, kind: str, openmetrics: bool) -> bytes:
    family = name.removesuffix("_total") if openmetrics and kind == "counter" else name
    help = help.replace("\\", "\\\\").replace("\n", "\\n")
    if openmetrics:
        help = help.replace('"', '\\"')
    return f"# HELP {family} {help}\n# TYPE {family} {kind}\n".encode()


def _write_numbers(
    out: list[bytes], name: str, label_names: tuple[str, ...], series: Series
) -> None:
    line = _line_format(name, label_names)
    quotes = 2 * len(label_names)
    for part in series.parts:
        rows = flat_rows(part)
        while chunk := list(islice(rows, CHUNK)):
            text = "".join(map(line.__mod__, chunk))
            clean = _plain(text, quotes * len(chunk), len(chunk))
            if not (clean and math.isfinite(sum(map(_last, chunk)))):
                text = "".join(line % _escaped(row) for row in chunk)
            out.append(text.encode("utf-8", "replace"))


def _write_histogram(out: list[bytes], family: HistogramFamily) -> None:
    spec = family.spec
    labels_format = ",".join(f'{label}="%s"' for label in spec.labels)
    label_sets = list(family.series)
    label_texts = [labels_format % labels for labels in label_sets]
    if not _plain("".join(label_texts), 2 * len(spec.labels) * len(label_sets), 0):
        label_texts = [labels_format % tuple(map(escape, labels)) for labels in label_sets]
    template = _histogram_template(spec.name, family.bounds, bool(spec.labels))
    per_chunk = max(CHUNK // (len(family.bounds) + 3), 1)
    lines: list[str] = []
    for labels, (buckets, total, count) in zip(label_texts, family.series.values(), strict=True):
        series = template.replace(_LABELS, labels.replace("%", "%%"))
        lines.append(series % (*accumulate(buckets), count, number(total)))
        if len(lines) >= per_chunk:
            out.append("".join(lines).encode("utf-8", "replace"))
            lines.clear()
    out.append("".join(lines).encode("utf-8", "replace"))


def _histogram_template(name: str, bounds: Sequence[float], labelled: bool) -> str:
    """The lines of one series of the histogram, its labels still to be put in place of
    _LABELS: `%d` per cumulative bucket count (+Inf last), then `%d` the count, `%s` the sum.
    Writing a series is then one replace and one format, whatever its number of buckets."""
    les = [_go_float(bound) for bound in bounds] + ["+Inf"]
    labels, joiner, braced = (_LABELS, ",", "{" + _LABELS + "}") if labelled else ("", "", "")
    buckets = "".join(f'{name}_bucket{{{labels}{joiner}le="{le}"}} %d\n' for le in les)
    return buckets + f"{name}_count{braced} %d\n{name}_sum{braced} %s\n"


def _line_format(name: str, label_names: tuple[str, ...]) -> str:
    """`name{a="%s",b="%s"} %s\\n`: label values, then the value."""
    if not label_names:
        return name + " %s\n"
    return name + "{" + ",".join(f'{label}="%s"' for label in label_names) + "} %s\n"


def _plain(text: str, quotes: int, newlines: int) -> bool:
    """True when the label values written into `text` needed no escaping: it holds only the
    quotes and newlines the format itself wrote, and no backslash."""
    return text.count('"') == quotes and text.count("\n") == newlines and "\\" not in text


def _escaped(row: tuple[Any, ...]) -> tuple[str, ...]:
    """A row's label values escaped and its value spelled out."""
    return (*map(escape, row[:-1]), number(row[-1]))


def escape(value: str) -> str:
    """A label value as both formats quote it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    """A sample value: Go's spelling of the special values, which both formats accept."""
    if math.isfinite(value):
        return str(value)
    return _go_float(value)


def _go_float(value: float) -> str:
    """Go's spelling, as Prometheus writes: prometheus_client's, loaded at the first special
    value or histogram, so that serve's first answers (finite gauges) wait for no
    prometheus_client (exporter/self_metrics.py)."""
    from prometheus_client.utils import floatToGoString

    return cast(Callable[[float], str], floatToGoString)(value)
