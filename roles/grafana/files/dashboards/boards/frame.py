"""The dashboard around the panels: template variables, grid layout, links, annotations."""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from .panels import Item, Panel
from .queries import CL, IDLE_THRESHOLD, PART, PROM

SCHEMA_VERSION = 42  # Grafana 12.2 - 13.x classic dashboard model
Variable = db.QueryVariable | db.DatasourceVariable | db.TextBoxVariable | db.ConstantVariable


# ------------------------------------------------------------------ template variables


def var_datasource(name: str, label: str, kind: str, text: str, uid: str) -> db.DatasourceVariable:
    return (
        db.DatasourceVariable(name)
        .label(label)
        .type(kind)
        .current(dm.VariableOption(text=text, value=uid))
        .regex("")
        .hide(dm.VariableHide.DONT_HIDE)
        .include_all(False)
        .multi(False)
    )


def var_prometheus() -> db.DatasourceVariable:
    return var_datasource(
        "datasource", "Prometheus", "prometheus", "gpufleet Prometheus", "gpufleet-prometheus"
    )


def var_loki() -> db.DatasourceVariable:
    return var_datasource("loki", "Loki", "loki", "gpufleet Loki", "gpufleet-loki")


def var_query(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    regex: str = "",
) -> db.QueryVariable:
    var = (
        db.QueryVariable(name)
        .label(label)
        .datasource(PROM)
        .query({"query": query, "refId": f"{name}-variable"})
        .regex(regex)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NUMERICAL_ASC)
        .hide(dm.VariableHide.DONT_HIDE)
        .include_all(include_all)
        .multi(multi)
        .options([])
    )
    if include_all:
        var.all_value(".*").current(dm.VariableOption(text=["All"], value=["$__all"]))
    return var


def var_idle_threshold() -> db.QueryVariable:
    """The idle threshold for panel titles (hidden): query_result's "{} 5 <ms>" -> 5."""
    query = f"query_result({IDLE_THRESHOLD})"
    var = var_query(
        "idle_threshold", "Idle threshold (%)", query, multi=False, include_all=False,
        regex="/ ([0-9.]+) [0-9]+$/",
    )  # fmt: skip
    return var.hide(dm.VariableHide.HIDE_VARIABLE)


def var_textbox(name: str, label: str) -> db.TextBoxVariable:
    empty = dm.VariableOption(text="", value="")
    var = db.TextBoxVariable(name).label(label).default_value("").current(empty)
    return var.hide(dm.VariableHide.DONT_HIDE)


def common_variables(*, node_multi: bool = True) -> list[Variable]:
    node_query = f'label_values(node:up:max{{{CL}, rack=~"${{rack}}", {PART}}}, node)'
    gpu_query = f'label_values(gpu:utilization_percent:max{{{CL}, node=~"${{node}}"}}, gpu)'
    return [
        var_prometheus(),
        var_query("cluster", "Cluster", "label_values(node:up:max, cluster)", multi=False),
        var_query("rack", "Rack", f"label_values(node:up:max{{{CL}}}, rack)"),
        var_query(
            "partition",
            "Partition",
            f"label_values(node_partition:membership:info{{{CL}}}, partition)",
        ),
        var_query("node", "Node", node_query, multi=node_multi, include_all=node_multi),
        var_query("gpu", "GPU", gpu_query),
    ]


# ------------------------------------------------------------------ layout


def grid(h: int, w: int, x: int, y: int) -> dm.GridPos:
    return dm.GridPos(h=h, w=w, x=x, y=y)


def layout(dash: db.Dashboard, items: Sequence[Item]) -> None:
    """Add rows and lines of panels (sized by span/height), filling 24-column lines in order.

    Positions are set here: the SDK's own placement wraps only on overflow, and a line of
    panels must start below the previous one.
    """
    y, pid = 0, 1
    for item in items:
        if isinstance(item, db.Row):
            dash.with_row(item.id(pid).grid_pos(grid(1, 24, 0, y)))
            pid, y = pid + 1, y + 1
            continue
        y, pid = place_line(dash, item, y, pid)


def place_line(dash: db.Dashboard, panels: Sequence[Panel], y: int, pid: int) -> tuple[int, int]:
    x, line_h = 0, 0
    for panel in panels:
        size = panel.build().grid_pos
        w, h = size.w, size.h
        if x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        dash.with_panel(panel.id(pid).grid_pos(grid(h, w, x, y)))
        pid, x, line_h = pid + 1, x + w, max(line_h, h)
    return y + line_h, pid


def row(title: str) -> db.Row:
    return db.Row(title).collapsed(False)


def section(title: str, *lines: list[Panel]) -> list[Item]:
    """A row and the lines of panels under it."""
    return [row(title), *lines]


# ------------------------------------------------------------------ the dashboard


def built_in_annotations() -> db.AnnotationQuery:
    return (
        db.AnnotationQuery()
        .built_in(1)
        .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .name("Annotations & Alerts")
        .type("dashboard")
    )


def gpufleet_links() -> db.DashboardLink:
    return (
        db.DashboardLink("gpufleet")
        .type(dm.DashboardLinkType.DASHBOARDS)
        .tags(["gpufleet"])
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True)
        .icon("external link")
        .target_blank(False)
        .tooltip("")
        .url("")
    )


def dashboard(
    uid: str,
    title: str,
    description: str,
    items: Sequence[Item],
    variables: Sequence[Variable],
    *,
    tags: Sequence[str],
    refresh: str = "1m",
    time_from: str = "now-6h",
) -> dm.Dashboard:
    """gpufleet's dashboard settings, links and annotations around `items` and `variables`."""
    dash = db.Dashboard(title).uid(uid).description(description).tags(["gpufleet", *tags])
    (
        dash.readonly()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh(refresh)
        .time(time_from, "now")
        .timezone("browser")
        .fiscal_year_start_month(0)
        .live_now(False)
        .annotation(built_in_annotations())
        .link(gpufleet_links())
        .variables(list(variables))
    )
    layout(dash, items)
    model = dash.build()
    model.schema_version = SCHEMA_VERSION  # the SDK stamps 41; Grafana 12.2+ writes 42
    return model


def var_constant(name: str, label: str, value: str) -> db.ConstantVariable:
    return db.ConstantVariable(name).label(label).value(value)
