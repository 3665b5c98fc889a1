"""Panels in gpufleet's house style (legend, tooltip, colours, sizes), one place for all
dashboards, made with grafana-foundation-sdk's typed panel builders."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import bargauge as sdk_bargauge
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import gauge as sdk_gauge
from grafana_foundation_sdk.builders import heatmap as sdk_heatmap
from grafana_foundation_sdk.builders import logs as sdk_logs
from grafana_foundation_sdk.builders import stat as sdk_stat
from grafana_foundation_sdk.builders import table as sdk_table
from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm

from .queries import LOKI, PROM, Query

Panel = cogbuilder.Builder[dm.Panel]
Item = cogbuilder.Builder[dm.RowPanel] | list[Panel]  # a row, or one line of panels


def dashboard_link(title: str, dashboard: str, var: str, value: str) -> db.DashboardLink:
    """A link to another gpufleet dashboard with ``var`` set to ``value``, keeping the
    time range, datasource (on a sharded site: the shard) and cluster."""
    return db.DashboardLink(f"{title} {value}").url(
        f"/d/{dashboard}?var-{var}={value}&${{__url_time_range}}"
        "&var-datasource=${datasource}&var-cluster=${cluster}"
    )


LOGS_LINK = dashboard_link("Logs of", "gpufleet-logs/logs", "node", "${__field.labels.node}")
# The Slurm job dashboard of the job in a row (tables: the job_id column) or a series.
JOB_ROW_LINK = dashboard_link(
    "Slurm job", "gpufleet-slurm-job/slurm-job", "job_id", "${__data.fields.job_id}"
)
JOB_SERIES_LINK = dashboard_link(
    "Slurm job", "gpufleet-slurm-job/slurm-job", "job_id", "${__field.labels.job_id}"
)
NODE_LINK = dashboard_link(
    "Node detail:", "gpufleet-node-detail/node-detail", "node", "${__field.labels.node}"
)


# ------------------------------------------------------------------ field config


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


PCT = thresholds((None, "green"), (70, "yellow"), (90, "red"))
TEMP = thresholds((None, "green"), (70, "yellow"), (80, "orange"), (85, "red"))


def dashed(ref: str, color: str | None = None) -> db.DashboardFieldConfigSourceOverrides:
    """Override that draws query `ref` as a dashed line (optionally in a fixed colour)."""
    props = [
        dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
        dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
        dm.DynamicConfigValue(id_val="custom.lineWidth", value=2),
    ]
    if color:
        fixed = {"mode": "fixed", "fixedColor": color}
        props.append(dm.DynamicConfigValue(id_val="color", value=fixed))
    return by_ref(ref, props)


def by_ref(ref: str, props: list[dm.DynamicConfigValue]) -> db.DashboardFieldConfigSourceOverrides:
    """Override applying `props` to the fields of query `ref`."""
    matcher = dm.MatcherConfig(id_val="byFrameRefID", options=ref)
    return db.DashboardFieldConfigSourceOverrides().matcher(matcher).properties(props)


def mirrored(ref: str) -> db.DashboardFieldConfigSourceOverrides:
    """Override that draws query `ref` below the axis (e.g. transmit under receive)."""
    return by_ref(ref, [dm.DynamicConfigValue(id_val="custom.transform", value="negative-Y")])


def palette() -> db.FieldColor:
    return db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC)


def by_thresholds() -> db.FieldColor:
    return db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)


def common(
    builder: Panel,
    title: str,
    queries: Sequence[Query],
    *,
    unit: str = "short",
    desc: str = "",
    steps: db.ThresholdsConfig | None = None,
    overrides: Sequence[db.DashboardFieldConfigSourceOverrides] = (),
    color: db.FieldColor | None = None,
    minmax: tuple[float | None, float | None] = (None, None),
    links: Sequence[db.DashboardLink] = (),
    datasource: cm.DataSourceRef = PROM,
    size: tuple[int, int] = (12, 8),
) -> Panel:
    """The settings every panel kind shares (title, queries, unit, colours, links, size)."""
    builder.span(size[0]).height(size[1]).title(title).description(desc)
    builder.datasource(datasource).targets(list(queries)).unit(unit)
    builder.color_scheme(color or palette()).overrides(list(overrides))
    if steps:
        builder.thresholds(steps)
    if minmax[0] is not None:
        builder.min(minmax[0])
    if minmax[1] is not None:
        builder.max(minmax[1])
    if links:
        builder.data_links(list(links))
    return builder


# ------------------------------------------------------------------ panels


def timeseries(
    title: str,
    queries: Sequence[Query],
    unit: str = "short",
    *,
    stack: bool = False,
    fill: int = 10,
    bars: bool = False,
    gradient: str = "none",
    threshold_style: str | None = None,
    **kw,
) -> sdk_timeseries.Panel:
    stacking = cb.StackingConfig().mode(cm.StackingMode("normal" if stack else "none")).group("A")
    p = (
        sdk_timeseries.Panel()
        .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(fill)
        .gradient_mode(cm.GraphGradientMode(gradient))
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(stacking)
        .axis_soft_min(0)
    )
    if threshold_style:
        mode = cm.GraphThresholdsStyleMode(threshold_style)
        p.thresholds_style(cb.GraphThresholdsStyleConfig().mode(mode))
    legend = (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.RIGHT)
        .calcs(["mean", "max"])
        .show_legend(True)
    )
    p.legend(legend).tooltip(
        cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)
    )
    return common(p, title, queries, unit=unit, **kw)


def with_limit(
    title: str,
    queries: Sequence[Query],
    limit: Query,
    unit: str = "short",
    color: str | None = "red",
    **kw,
) -> sdk_timeseries.Panel:
    """`queries` drawn against `limit` (query B), a dashed line."""
    over = [dashed("B", color)]
    return timeseries(title, [*queries, limit], unit, overrides=over, **kw)


def last_value() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def stat(
    title: str,
    queries: Sequence[Query],
    unit: str = "short",
    steps: db.ThresholdsConfig | None = None,
    options_text: str = "auto",
    **kw,
) -> sdk_stat.Panel:
    p = (
        sdk_stat.Panel()
        .reduce_options(last_value())
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .text_mode(cm.BigValueTextMode(options_text))
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
    )
    steps = steps or thresholds((None, "blue"))
    return common(p, title, queries, unit=unit, steps=steps, color=by_thresholds(), **kw)


def table(
    title: str,
    queries: Sequence[Query],
    *,
    rename: dict[str, str] | None = None,
    hide: Sequence[str] = (),
    **kw,
) -> sdk_table.Panel:
    exclude = {name: True for name in ["Time", *hide]}
    organize = {"excludeByName": exclude, "renameByName": rename or {}}
    transformations = [
        dm.DataTransformerConfig(id_val="merge", options={}),
        dm.DataTransformerConfig(id_val="organize", options=organize),
    ]
    p = (
        sdk_table.Panel()
        .show_header(True)
        .cell_height(cm.TableCellHeight.SM)
        .footer(cb.TableFooterOptions().show(False))
        .transformations(transformations)
    )
    return common(p, title, queries, **kw)


def gauge(title: str, queries: Sequence[Query], **kw) -> sdk_gauge.Panel:
    p = (
        sdk_gauge.Panel()
        .reduce_options(last_value())
        .show_threshold_markers(True)
        .show_threshold_labels(False)
        .orientation(cm.VizOrientation.AUTO)
    )
    return common(p, title, queries, color=by_thresholds(), **kw)


def bargauge(title: str, queries: Sequence[Query], **kw) -> sdk_bargauge.Panel:
    p = (
        sdk_bargauge.Panel()
        .orientation(cm.VizOrientation.HORIZONTAL)
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(last_value())
        .show_unfilled(True)
    )
    return common(p, title, queries, **kw)


def logs(title: str, queries: Sequence[Query], **kw) -> sdk_logs.Panel:
    p = (
        sdk_logs.Panel()
        .show_time(True)
        .wrap_log_message(True)
        .sort_order(cm.LogsSortOrder.DESCENDING)
        .enable_log_details(True)
        .dedup_strategy(cm.LogsDedupStrategy.NONE)
        .prettify_log_message(False)
        .show_labels(False)
        .show_common_labels(False)
    )
    return common(p, title, queries, datasource=LOKI, **kw)


def heatmap(title: str, query: Query, **kw) -> sdk_heatmap.Panel:
    colors = (
        sdk_heatmap.HeatmapColorOptions()
        .mode(hm.HeatmapColorMode.SCHEME)
        .scheme("RdYlGn")
        .fill("dark-orange")
        .scale(hm.HeatmapColorScale.LINEAR)
        .exponent(0.5)
        .steps(64)
        .reverse(False)
        .min(0)
        .max(100)
    )
    p = (
        sdk_heatmap.Panel()
        .calculate(False)
        .y_axis(sdk_heatmap.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT).reverse(False))
        .rows_frame(sdk_heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.AUTO))
        .color(colors)
        .cell_gap(1)
        .show_legend()
        .mode(cm.TooltipDisplayMode.SINGLE)
        .hide_y_histogram()
        .show_color_scale(True)
        .exemplars_color("rgba(255,0,255,0.7)")
        .filter_values(sdk_heatmap.FilterValueRange().le(1e-09))
    )
    return common(p, title, [query], **kw)
