"""report.html: one self-contained file (inline CSS and SVG, no network)."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from infertune_tuner.metrics import LATENCY_METRICS
from infertune_tuner.report.plot import MAX_LABELS, pareto_svgs
from infertune_tuner.report.view import build_view, chances_cell, error_pct, measured_times
from infertune_tuner.result import Report

_env = Environment(
    loader=PackageLoader("infertune_tuner.report", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["error_pct"] = error_pct
_env.globals["chances_cell"] = chances_cell
_env.globals["measured_times"] = measured_times
_env.globals["latency_metrics"] = LATENCY_METRICS
_env.globals["max_labels"] = MAX_LABELS


def render_html(report: Report) -> str:
    view = build_view(report)
    svgs = [Markup(svg) for svg in pareto_svgs(view.plots)]
    return _env.get_template("report.html.j2").render(
        report=report, view=view, request=view.request, svgs=svgs
    )
