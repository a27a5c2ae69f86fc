"""The Pareto plots as inline SVG: throughput against each bounded latency percentile.

One plot per SLO bound (view.Plot). Every measured configuration is one point, labelled with
its full configuration (TP, batch, weights, KV cache: two points never share a label); the
dashed front joins the SLO-meeting points only; the chosen one is ringed. A study of more than
MAX_LABELS measured configurations labels the chosen one, the front and then the fastest, up to
MAX_LABELS (a thousand labels cover the plot and each other; the report's tables list every
configuration), and says so under the plot. Labels sit beside
their points on no marker and no other label (labels.py); a far one gets a leader line.

The SVG keeps what a test or a tool needs to read it back: the groups ``meets-slo``,
``misses-slo``, ``chosen`` (markers), ``pareto-front`` (the dashed line) and ``label-<n>``
(each label, its text in a comment), each prefixed ``pareto<k>-`` (the k-th plot of a page).
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

from infertune_tuner.report.labels import Box, place
from infertune_tuner.report.view import Plot, Point

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

DPI = 100
MARKER_SIZE = 36  # points^2 (matplotlib's default scatter size)
CHOSEN_SIZE = 220  # points^2: the ring around the chosen configuration
HEIGHT_PER_POINT = 0.1  # inches of plot height per labelled point beyond 12: labels need room
# Labels per plot, at most: 60 labels of ~30 characters fill the plot grown to its 9.6 inches.
MAX_LABELS = 60
MARKER_PAD = 1.5  # pixels kept clear around a marker


def _radius(size: float) -> float:
    """A scatter marker's radius in display pixels (size in points^2)."""
    return math.sqrt(size) / 2 * DPI / 72 + MARKER_PAD


def _priority(p: Point) -> tuple[int, float]:
    """Who gets the nearest free spot first: the chosen one, then the rest by throughput."""
    return (0 if p.chosen else 1, -p.merit)


def labelled(plot: Plot) -> list[int]:
    """The indexes of the points that get a label, the first placed first: every point when
    there are at most MAX_LABELS, else the chosen one, the front, then the fastest."""
    front = {id(p) for p in plot.front}
    chosen = sorted(
        range(len(plot.points)),
        key=lambda i: (_priority(plot.points[i])[0], id(plot.points[i]) not in front,
                       _priority(plot.points[i])[1]),
    )[:MAX_LABELS]  # fmt: skip
    return sorted(chosen, key=lambda i: _priority(plot.points[i]))


def _place_labels(ax: Axes, plot: Plot, gid: str) -> list[Text]:
    fig = ax.figure
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    order = labelled(plot)
    to_px = ax.transData.transform
    anchors = [tuple(to_px((p.latency_ms, plot.y(p)))) for p in plot.points]
    texts: dict[int, Text] = {}
    for i in sorted(order):
        p = plot.points[i]
        text = ax.text(
            p.latency_ms, plot.y(p), p.label, fontsize=7, ha="left", va="bottom", zorder=5
        )
        text.set_gid(f"{gid}-label-{i}")
        texts[i] = text
    sizes = {}
    for i, t in texts.items():
        extent = t.get_window_extent(renderer)
        sizes[i] = (extent.width + 2, extent.height + 1)
    obstacles = []
    for i, (x, y) in enumerate(anchors):
        r = _radius(CHOSEN_SIZE if plot.points[i].chosen else MARKER_SIZE)
        obstacles.append(Box(x - r, y - r, x + r, y + r))
    area = ax.get_window_extent(renderer)
    bounds = Box(area.x0 + 2, area.y0 + 2, area.x1 - 2, area.y1 - 2)
    placed = place([anchors[i] for i in order], [sizes[i] for i in order], obstacles, bounds)
    to_data = ax.transData.inverted().transform
    for i, spot in zip(order, placed, strict=True):
        texts[i].set_position(tuple(to_data((spot.box.x0 + 1, spot.box.y0))))
        if spot.leader:
            x, y = anchors[i]
            b = spot.box
            end = (min(max(x, b.x0), b.x1), min(max(y, b.y0), b.y1))  # nearest point of the box
            (xs, ys) = zip(to_data((x, y)), to_data(end), strict=True)
            ax.plot(xs, ys, c="#8d99ae", lw=0.6, zorder=1.5)
    return [texts[i] for i in sorted(texts)]


def figure(plot: Plot, *, title: str, gid: str = "pareto") -> tuple[Figure, list[Text]]:
    """The plot as a matplotlib figure, and its label artists (placed). Its SVG groups are
    named ``<gid>-meets-slo`` and so on (several plots share one HTML page: ids stay unique)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    height = 4.8 + HEIGHT_PER_POINT * max(0, min(len(plot.points), MAX_LABELS) - 12)
    fig, ax = plt.subplots(figsize=(8, height), dpi=DPI)
    ok = [p for p in plot.points if p.slo_ok]
    bad = [p for p in plot.points if not p.slo_ok]
    meets = ax.scatter([p.latency_ms for p in ok], [plot.y(p) for p in ok], c="#2a9d8f",
                       s=MARKER_SIZE, label="meets SLO", zorder=3)  # fmt: skip
    meets.set_gid(f"{gid}-meets-slo")
    misses = ax.scatter([p.latency_ms for p in bad], [plot.y(p) for p in bad], c="#e76f51",
                        s=MARKER_SIZE, marker="x", label="misses SLO", zorder=3)  # fmt: skip
    misses.set_gid(f"{gid}-misses-slo")
    if plot.front:  # one point (the chosen one, alone) draws no line and needs no legend
        name = "Pareto front (meets SLO)" if len(plot.front) > 1 else "_front"
        (line,) = ax.plot(
            [p.latency_ms for p in plot.front], [plot.y(p) for p in plot.front], c="#264653",
            lw=1, ls="--", label=name, zorder=2,
        )  # fmt: skip
        line.set_gid(f"{gid}-pareto-front")
    limit = ax.axvline(plot.bound.max_ms, c="#e63946", lw=1.5, label=f"SLO {plot.bound.label()}")
    limit.set_gid(f"{gid}-slo-bound")
    chosen = [p for p in plot.points if p.chosen]
    if chosen:
        ring = ax.scatter([chosen[0].latency_ms], [plot.y(chosen[0])], s=CHOSEN_SIZE,
                          facecolors="none", edgecolors="#1d3557", lw=2, label="chosen",
                          zorder=4)  # fmt: skip
        ring.set_gid(f"{gid}-chosen")
    ax.set_xlabel(plot.axis_label)
    ax.set_ylabel(plot.y_label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    # The legend sits below the axes: inside, it would cover points or labels.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.margins(x=0.15, y=0.12)  # room for the labels of the outermost points
    fig.tight_layout()
    return fig, _place_labels(ax, plot, gid)


def plot_svg(plot: Plot, *, title: str, gid: str = "pareto") -> str:
    import matplotlib
    from matplotlib import pyplot as plt

    # A fixed salt for the SVG's internal ids: the same report, the same SVG (ids still differ
    # where content does, so several plots on one page never share a clip path by mistake).
    with matplotlib.rc_context({"svg.hashsalt": "infertune"}):
        fig, _ = figure(plot, title=title, gid=gid)
        try:
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
        finally:
            plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def pareto_svgs(plots: list[Plot]) -> list[str]:
    """One SVG per plot; the title names the bound when there are several."""
    return [
        plot_svg(
            p,
            title="Throughput vs latency of measured configurations"
            + (f": {p.bound.label()}" if len(plots) > 1 else ""),
            gid=f"pareto{k}",
        )
        for k, p in enumerate(plots)
    ]
