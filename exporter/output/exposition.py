"""Prometheus text (0.0.4) and OpenMetrics (1.0.0) written straight from the store's families.

Why not prometheus_client's writers: they check every label name of every sample and build a
Sample and a dict per series per scrape. 75k series took 0.95 s that way; here a line is its
start, `name{a="x",b="y"} ` (kept from the render before), its value's str() and a newline
(bench/exposition.py has the figures against prometheus_client and a plain text writer).

Line starts are kept (LineStarts): formatting a series' label values costs about as much as
spelling a non-integral value, and from one scrape to the next the label sets barely change,
so a line is a lookup, its value's str() and a join (30k series: 1.4-1.8x faster than one `%`
format per line). A series new to a render has its start formatted once, by a format made
once per family; only the starts of the last render's series are kept, so label sets gone
from the store are let go at the next render. The price: a string per series kept between
scrapes (75k series: about 10 MiB of RSS), and a first render some 10-20% slower.

Escaping without a cost per label value: new starts are formatted a chunk at a time without
escaping, then checked. n starts whose k label values hold no quote, backslash or newline
have exactly 2*k*n quotes, no newline and no backslash; any such character in a value breaks
that count, and those starts are formatted again with every value escaped.
Values are checked the same way, by their sum: a sum that is not finite sends the chunk's
values to the careful speller, which spells +Inf, -Inf and NaN as both formats want.

Exemplars (OpenMetrics only; the 0.0.4 text format has no place for them): a counter's line
or a histogram bucket's line ends with ` # {trace_id="..",span_id=".."} value timestamp`
where the store kept one. A family without exemplars takes the path above unchanged; one with
them adds a lookup per line of its counters and a second template for its histogram series
that keep one.

Chunks keep memory flat: a few thousand lines are joined and encoded at a time, so what stays
is the encoded body and the kept starts, not a string per line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, islice, repeat
from typing import cast

from exporter.output.samples import LabelValues, Series, label_sets_and_values
from exporter.output.store import (
    BucketExemplars,
    Exemplar,
    Family,
    HistogramFamily,
    HistogramPoint,
    NumberFamily,
)

# The formats' media types, as prometheus_client names them (CONTENT_TYPE_PLAIN_0_0_4 and the
# OpenMetrics CONTENT_TYPE_LATEST, tests/output/test_exposition.py): spelled here, since serve answers
# its first scrapes before prometheus_client loads (exporter/output/self_metrics.py).
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS_EOF = b"# EOF\n"  # the end of an OpenMetrics exposition, after every family
CHUNK = 2048  # lines joined at a time
_LABELS = "\x00"  # where a histogram template takes a series' labels (never in a name or bound)


@dataclass(frozen=True, slots=True, eq=False)
class Rendered:
    """A whole exposition and the right to send it: the fences (Leadership.fence) of every
    lease its sampled series were served under. The right travels with the body, so any
    number of renders in flight each keep their own, and nothing is looked up by identity."""

    body: bytes
    fences: tuple[Callable[[], bool], ...] = ()

    def still_served(self) -> bool:
        """Whether the body may be sent now: every lease it was rendered under is still held
        (the same token, not expired). True for a body rendered under no lease."""
        return all(fence() for fence in self.fences)


class LineStarts:
    """The start of each gauge or counter series' lines, `name{a="x",b="y"} `, as the last
    render wrote it: by the family's start format (_start_format), then by label values.

    One per Telemetry, shared by its two formats' renders: a start is the same in both.
    Renders running at once each keep what they wrote, the last to finish wins; a start is
    never wrong, at worst formatted again."""

    def __init__(self) -> None:
        self.by_format: dict[str, dict[LabelValues, str]] = {}


def render(families: Iterable[Family], openmetrics: bool, starts: LineStarts) -> list[bytes]:
    """The exposition of these families, as encoded chunks (without OpenMetrics' `# EOF`);
    `starts` then holds the line starts of these families' series, and only theirs."""
    out: list[bytes] = []
    kept: dict[str, dict[LabelValues, str]] = {}
    for family in families:
        spec = family.spec
        out.append(_header(spec.name, spec.help, spec.kind, openmetrics))
        if isinstance(family, NumberFamily):
            start = _start_format(spec.name, spec.labels)
            known = starts.by_format.get(start, {})
            quotes = 2 * len(spec.labels)  # in a start, around its label values
            ends = _exemplar_ends(family.exemplars) if openmetrics and family.exemplars else None
            kept[start] = _write_numbers(out, start, quotes, family.series, known, ends)
        else:
            _write_histogram(out, family, openmetrics and bool(family.exemplars))
    starts.by_format = kept
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
    out: list[bytes],
    start_format: str,
    quotes: int,
    series: Series,
    known: dict[LabelValues, str],
    ends: Mapping[LabelValues, str] | None = None,
) -> dict[LabelValues, str]:
    """Writes the series' lines, taking their starts from `known` (adding those it lacks);
    `ends`: the end of the lines that carry an exemplar (the others end with a newline).
    Returns the starts to keep: `known`, unless it holds label sets the series no longer have."""
    for part in series.parts:
        label_sets, values = label_sets_and_values(part)
        while chunk := list(islice(label_sets, CHUNK)):
            try:
                starts = list(map(known.__getitem__, chunk))
            except KeyError:  # label sets new to this render
                starts = _new_starts(chunk, start_format, quotes, known)
            numbers = list(islice(values, len(chunk)))
            spell: Callable[[float], str] = str if _finite(numbers) else number
            line_ends: Iterable[str] = (
                repeat("\n") if ends is None else [ends.get(labels, "\n") for labels in chunk]
            )
            text = "".join(
                chain.from_iterable(zip(starts, map(spell, numbers), line_ends, strict=False))
            )
            out.append(text.encode("utf-8", "replace"))
    if len(known) == len(series):
        return known
    # Some label sets are gone from the store: keep this render's alone.
    return {
        labels: known[labels] for part in series.parts for labels in label_sets_and_values(part)[0]
    }


def _new_starts(
    chunk: list[LabelValues], start_format: str, quotes: int, known: dict[LabelValues, str]
) -> list[str]:
    """The chunk's starts, those missing from `known` formatted and added to it."""
    new = [labels for labels in chunk if labels not in known]
    texts = [start_format % labels for labels in new]
    if not _plain("".join(texts), quotes * len(texts)):
        texts = [start_format % tuple(map(escape, labels)) for labels in new]
    known.update(zip(new, texts, strict=True))
    return list(map(known.__getitem__, chunk))


def _write_histogram(out: list[bytes], family: HistogramFamily, with_exemplars: bool) -> None:
    """The family's lines; `with_exemplars` (OpenMetrics, and the family keeps some): its
    series' bucket lines carry the exemplars kept."""
    spec = family.spec
    labels_format = ",".join(f'{label}="%s"' for label in spec.labels)
    label_sets = list(family.series)
    label_texts = [labels_format % labels for labels in label_sets]
    if not _plain("".join(label_texts), 2 * len(spec.labels) * len(label_sets)):
        label_texts = [labels_format % tuple(map(escape, labels)) for labels in label_sets]
    template = _histogram_template(spec.name, family.bounds, bool(spec.labels))
    texts = zip(label_texts, family.series.values(), strict=True)
    if with_exemplars:
        series = _exemplified_series(family, label_sets, texts, template)
    else:  # the common case: no lookup per series
        series = (
            template.replace(_LABELS, labels.replace("%", "%%"))
            % (*accumulate(buckets), count, number(total))
            for labels, (buckets, total, count) in texts
        )
    per_chunk = max(CHUNK // (len(family.bounds) + 3), 1)
    while lines := list(islice(series, per_chunk)):
        out.append("".join(lines).encode("utf-8", "replace"))


def _exemplified_series(
    family: HistogramFamily,
    label_sets: list[LabelValues],
    texts: Iterable[tuple[str, HistogramPoint]],
    template: str,
) -> Iterator[str]:
    """Each series' lines, those of a series that keeps exemplars written with them."""
    spec, exemplars = family.spec, family.exemplars
    exemplified = _histogram_template(spec.name, family.bounds, bool(spec.labels), True)
    for label_values, (labels, (buckets, total, count)) in zip(label_sets, texts, strict=True):
        slots = exemplars.get(label_values)
        if slots is None:
            lines = template.replace(_LABELS, labels.replace("%", "%%"))
            yield lines % (*accumulate(buckets), count, number(total))
        else:
            lines = exemplified.replace(_LABELS, labels.replace("%", "%%"))
            yield lines % (*_with_exemplars(buckets, slots), count, number(total))


def _histogram_template(
    name: str, bounds: Sequence[float], labelled: bool, exemplars: bool = False
) -> str:
    """The lines of one series of the histogram, its labels still to be put in place of
    _LABELS: `%d` per cumulative bucket count (+Inf last), then `%d` the count, `%s` the sum.
    Writing a series is then one replace and one format, whatever its number of buckets.
    `exemplars`: each bucket's count is followed by `%s`, its exemplar's text or nothing."""
    les = [_go_float(bound) for bound in bounds] + ["+Inf"]
    labels, joiner, braced = (_LABELS, ",", "{" + _LABELS + "}") if labelled else ("", "", "")
    after = "%s" if exemplars else ""
    buckets = "".join(f'{name}_bucket{{{labels}{joiner}le="{le}"}} %d{after}\n' for le in les)
    return buckets + f"{name}_count{braced} %d\n{name}_sum{braced} %s\n"


def _with_exemplars(buckets: list[int], slots: BucketExemplars) -> Iterable[int | str]:
    """Each cumulative bucket count, then its exemplar's text (or nothing)."""
    texts = ("" if exemplar is None else exemplar_text(exemplar) for exemplar in slots)
    return chain.from_iterable(zip(accumulate(buckets), texts, strict=True))


def _exemplar_ends(exemplars: Mapping[LabelValues, Exemplar]) -> dict[LabelValues, str]:
    """The end of each counter line that carries an exemplar: its text and the newline."""
    return {labels: exemplar_text(exemplar) + "\n" for labels, exemplar in exemplars.items()}


def exemplar_text(exemplar: Exemplar) -> str:
    """` # {trace_id="..",span_id=".."} value timestamp`, as OpenMetrics 1.0 writes an
    exemplar after a sample (its label set far under the 128 characters it allows). The store
    keeps only hex ids and finite values (store.sound_exemplar): nothing to escape or spell."""
    return (
        f' # {{trace_id="{exemplar.trace_id}",span_id="{exemplar.span_id}"}} '
        f"{exemplar.value} {exemplar.time}"
    )


def _start_format(name: str, label_names: tuple[str, ...]) -> str:
    """`name{a="%s",b="%s"} `, to be given a series' label values: its lines' start."""
    if not label_names:
        return name + " "
    return name + "{" + ",".join(f'{label}="%s"' for label in label_names) + "} "


def _plain(text: str, quotes: int) -> bool:
    """True when the label values written into `text` needed no escaping: it holds only the
    quotes the format itself wrote, and no newline or backslash."""
    return text.count('"') == quotes and "\n" not in text and "\\" not in text


def escape(value: str) -> str:
    """A label value as both formats quote it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _finite(numbers: list[float]) -> bool:
    """True when every value is finite: their float sum is (integers are converted one by one,
    so two huge ones cannot cancel out)."""
    try:
        return math.isfinite(sum(numbers, 0.0))
    except OverflowError:  # an integer beyond float range: spelled +Inf or -Inf by number()
        return False


def number(value: float) -> str:
    """A sample value: Go's spelling of the special values, which both formats accept; an
    integer beyond float range is +Inf or -Inf, so no value can make a render fail."""
    try:
        value = float(value)
    except OverflowError:
        value = math.inf if value > 0 else -math.inf
    if math.isfinite(value):
        return str(value)
    return _go_float(value)


def _go_float(value: float) -> str:
    """Go's spelling, as Prometheus writes: prometheus_client's, loaded at the first special
    value or histogram, so that serve's first answers (finite gauges) wait for no
    prometheus_client (exporter/output/self_metrics.py)."""
    from prometheus_client.utils import floatToGoString

    return cast(Callable[[float], str], floatToGoString)(value)
