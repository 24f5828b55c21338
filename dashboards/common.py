"""What every dashboard shares: variables, label selectors and panel constructors.

Every panel is built through `panel()`, which needs a description and a unit, so no dashboard
can ship a panel without them. Queries read the raw metrics (dashboards work without the
recording rules loaded) and deduplicate sampled gauges across exporter replicas, as the rules do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["queue-exporter"]

# Label matchers by scope. The "All" value of every variable is ".*", which also matches
# series without the label (no `namespace` outside Kubernetes).
TARGET = 'namespace=~"$namespace", job=~"$job"'
SYSTEM = TARGET + ', system=~"$system"'
QUEUE = SYSTEM + ', queue=~"$queue"'
JOB_TYPE = QUEUE + ', job_type=~"$job_type"'
# Sampled gauges are read by every replica of the exporter: one value per queue, not a sum.
DEDUP = "max without (instance, pod)"
RATE = "$__rate_interval"

# The metrics that name the systems and queues an installation has, for the variables.
_QUEUE_METRICS = "queue_depth|queue_jobs_enqueued_total|queue_jobs_completed_total|queue_workers"


def variables() -> list[cogbuilder.Builder[model.VariableModel]]:
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _label_variable("namespace", "Namespace", "queue_exporter_build_info", "namespace"),
        _label_variable("job", "Job", 'queue_exporter_build_info{namespace=~"$namespace"}', "job"),
        _label_variable(
            "system", "System", f'{{__name__=~"{_QUEUE_METRICS}", {TARGET}}}', "system"
        ),
        _label_variable("queue", "Queue", f'{{__name__=~"{_QUEUE_METRICS}", {SYSTEM}}}', "queue"),
        _label_variable(
            "job_type",
            "Job type",
            f'{{__name__=~"queue_jobs_enqueued_total|queue_jobs_completed_total", {QUEUE}}}',
            "job_type",
        ),
    ]


def _label_variable(
    name: str, label: str, selector: str, label_name: str
) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({selector}, {label_name})")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text="All", value="$__all"))
    )


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


Kind = Literal["timeseries", "stat", "bargauge"]
PanelBuilder = timeseries.Panel | stat.Panel | bargauge.Panel


def panel(
    kind: Kind,
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    max_value: float | None = None,
    exemplars: bool = False,
) -> PanelBuilder:
    """`exemplars`: the panel's range queries ask Prometheus for exemplars too (Grafana draws
    them as points; their trace link is the Prometheus data source's, TRACES_LINK)."""
    built: PanelBuilder
    if kind == "timeseries":
        series = timeseries.Panel().line_width(1).fill_opacity(10 if not stacked else 40)
        if stacked:
            series = series.stacking(
                common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
            )
        built = series
    elif kind == "stat":
        built = (
            stat.Panel()
            .graph_mode(common.BigValueGraphMode.AREA)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        )
    else:
        built = (
            bargauge.Panel()
            .orientation(common.VizOrientation.HORIZONTAL)
            .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        )
    built = (
        built.title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .min(0)
    )
    if max_value is not None:
        built = built.max(max_value)
    # Stats draw a sparkline of the range; bar gauges rank the current values.
    instant = kind == "bargauge"
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(ref)
            .datasource(DATASOURCE)
        )
        if exemplars and not instant:
            target = target.exemplar(True)
        built = built.with_target(target.instant() if instant else target.range())
    if exemplars:
        built = built.links([TRACES_LINK])
    return built


# The tracing data source the job-duration panels point to (Tempo by default; docs/
# dashboards-and-alerts.md, *Exemplars*, for Jaeger). Grafana takes an exemplar's own link
# from the Prometheus data source's exemplar settings (exemplarTraceIdDestinations), which a
# dashboard cannot set; the panels link to the traces of this data source in Explore.
TRACING_DATASOURCE = "tracing_datasource"
TRACES_LINK = (
    dashboard.DashboardLink(f"Traces in ${{{TRACING_DATASOURCE}}}")
    .type(model.DashboardLinkType.LINK)
    .url(f'/explore?left={{"datasource":"${{{TRACING_DATASOURCE}}}"}}')
    .target_blank(True)
)


def tracing_variable() -> dashboard.DatasourceVariable:
    return (
        dashboard.DatasourceVariable(TRACING_DATASOURCE).label("Tracing data source").type("tempo")
    )


def quantiles(metric: str, selector: str, by: str = "") -> tuple[Query, ...]:
    """p50, p95 and p99 of a histogram over the selection (split by `by` when given)."""
    group = f"{by}, le" if by else "le"
    prefix = f"{{{{{by}}}}} " if by else ""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"{prefix}p{int(float(q) * 100)}",
        )
        for q in ("0.5", "0.95", "0.99")
    )


PRODUCT = "Queue exporter"


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    """A dashboard titled "Queue exporter / <title>": among a Grafana's other dashboards, the
    product name says whose they are."""
    builder = (
        dashboard.Dashboard(f"{PRODUCT} / {title}")
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .link(
            dashboard.DashboardLink("queue-exporter")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in variables():
        builder = builder.with_variable(variable)
    return builder
