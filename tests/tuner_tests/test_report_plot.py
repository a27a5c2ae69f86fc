"""The Pareto plots of report.html, read back from the SVG a browser shows: every point labelled
uniquely (KV-cache dtype included), a front made of SLO-meeting points only, one plot per SLO
bound, and labels that collide with nothing."""

from __future__ import annotations

import itertools
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from matplotlib.transforms import Bbox
from typer.testing import CliRunner

from infertune_operator.cli import app
from infertune_tuner.report.plot import figure
from infertune_tuner.report.view import build_view
from infertune_tuner.result import Report

REPO = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"
# A configuration, and " \u00d7N" (the times sign) when it was measured N times.
LABEL = re.compile(r"tp\d+/bs\d+/\w+/kv-(auto|fp8)( \u00d7\d+)?")


def _tune(tmp_path: Path, spec: Path, *args: str) -> Path:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["tune", str(spec), "--out", str(out), "--no-progress", *args])
    assert result.exit_code in (0, 3), result.output
    return out


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick start with the random sampler and 40 trials: many points, close together,
    several pairs that differ only in their KV-cache dtype."""
    return _tune(tmp_path_factory.mktemp("dense"), REPO / "examples" / "llama2-70b-h100.yaml",
                 "--sampler", "random", "--max-trials", "40")  # fmt: skip


@pytest.fixture(scope="module")
def two_bounds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped replay example (TTFT and ITL bounds), every configuration measured."""
    ex = REPO / "examples" / "replay"
    return _tune(tmp_path_factory.mktemp("two"), ex / "h100-llama2-13b.yaml",
                 "--backend", f"replay:{ex / 'h100-llama2-13b.csv'}", "--sampler", "grid")  # fmt: skip


def _svgs(out: Path) -> list[ET.Element]:
    html = (out / "report.html").read_text()
    found = []
    for text in re.findall(r"<svg.*?</svg>", html, flags=re.S):
        parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
        parser.feed(text)
        found.append(parser.close())
    return found


def _group(svg: ET.Element, suffix: str) -> ET.Element | None:
    return next((g for g in svg.iter(f"{SVG}g") if g.get("id", "").endswith(suffix)), None)


def _markers(svg: ET.Element, suffix: str) -> list[tuple[float, float]]:
    g = _group(svg, suffix)
    if g is None:
        return []
    return [(float(u.get("x", "nan")), float(u.get("y", "nan"))) for u in g.iter(f"{SVG}use")]


def _labels(svg: ET.Element) -> list[str]:
    out = []
    for g in svg.iter(f"{SVG}g"):
        if re.fullmatch(r"pareto\d+-label-\d+", g.get("id", "")):
            comments = [c.text.strip() for c in g.iter() if c.tag is ET.Comment and c.text]
            out.append(comments[0])
    return out


def _front(svg: ET.Element) -> list[tuple[float, float]]:
    g = _group(svg, "-pareto-front")
    if g is None:
        return []
    path = next(g.iter(f"{SVG}path")).get("d", "")
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path)]
    return list(zip(numbers[::2], numbers[1::2], strict=True))


def _near(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) < 0.05 and abs(a[1] - b[1]) < 0.05


def test_every_point_has_a_unique_full_label(dense: Path) -> None:
    report = json.loads((dense / "report.json").read_text())
    measured = [c for c in report["measured"] if c["metrics"]]
    (svg,) = _svgs(dense)
    labels = _labels(svg)
    assert (
        len(labels)
        == len(measured)
        == len(_markers(svg, "-meets-slo")) + len(_markers(svg, "-misses-slo"))
    )
    assert len(set(labels)) == len(labels), sorted(labels)
    assert all(LABEL.fullmatch(label) for label in labels), labels
    # The case that used to read twice as "tp4/bs192/fp8": the KV dtype tells them apart.
    bare = [re.sub(r"/kv-\w+.*", "", label) for label in labels]
    assert len(set(bare)) < len(bare), "the study has no pair differing only in KV dtype"


def test_the_front_joins_slo_meeting_points_only(dense: Path) -> None:
    (svg,) = _svgs(dense)
    meets, misses, front = (_markers(svg, "-meets-slo"), _markers(svg, "-misses-slo"),
                            _front(svg))  # fmt: skip
    assert misses, "the study has points that miss the SLO"
    assert len(front) >= 2
    for vertex in front:
        assert any(_near(vertex, m) for m in meets), f"{vertex} is no SLO-meeting point"
        assert not any(_near(vertex, m) for m in misses), f"{vertex} misses the SLO"
    # And it is the whole front: every SLO-meeting point off it is dominated by one on it
    # (SVG y grows downwards: more throughput is a smaller y).
    for m in meets:
        if not any(_near(m, v) for v in front):
            assert any(v[0] <= m[0] and v[1] <= m[1] for v in front), m
    # It is also the front of the report's own numbers.
    report = json.loads((dense / "report.json").read_text())
    ok = [
        (c["metrics"]["e2e_ms"]["p95"], c["metrics"]["output_tokens_per_s_per_gpu"])
        for c in report["measured"]
        if c["slo_ok"]
    ]
    on_front = [p for p in ok if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in ok)]
    assert len(on_front) == len(front)


def test_one_plot_per_slo_bound(two_bounds: Path) -> None:
    svgs = _svgs(two_bounds)
    assert len(svgs) == 2
    html = (two_bounds / "report.html").read_text()
    assert "Throughput vs latency of measured configurations: TTFT p95 &lt;= 1000 ms" in html
    assert "Throughput vs latency of measured configurations: ITL p95 &lt;= 30 ms" in html
    report = json.loads((two_bounds / "report.json").read_text())
    measured = len([c for c in report["measured"] if c["metrics"]])
    assert measured >= 20  # the grid, less what its measurements ruled out, less 2 OOM
    for svg in svgs:
        labels = _labels(svg)
        assert len(labels) == measured and len(set(labels)) == measured
        assert _group(svg, "-chosen") is not None
        for vertex in _front(svg):
            assert any(_near(vertex, m) for m in _markers(svg, "-meets-slo"))


@pytest.mark.parametrize("which", ["dense", "two_bounds"])
def test_labels_collide_with_nothing(which: str, request: pytest.FixtureRequest) -> None:
    """No label overlaps another label, a marker or the chosen configuration's ring."""
    out: Path = request.getfixturevalue(which)
    view = build_view(Report.model_validate_json((out / "report.json").read_text()))
    for plot in view.plots:
        fig, texts = figure(plot, title="t")
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        boxes = [t.get_window_extent(renderer) for t in texts]
        for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
            assert not a.overlaps(b), (texts[i].get_text(), texts[j].get_text())
        ax = fig.axes[0]
        for collection in ax.collections:  # the markers, and the chosen one's ring
            (size,) = set(collection.get_sizes())
            r = math.sqrt(size) / 2 * fig.dpi / 72
            for x, y in collection.get_offsets():
                px, py = ax.transData.transform((x, y))
                marker = Bbox.from_extents(px - r, py - r, px + r, py + r)
                for t, box in zip(texts, boxes, strict=True):
                    assert not box.overlaps(marker), f"{t.get_text()} covers {(x, y)}"
        area = ax.get_window_extent(renderer)
        assert all(area.x0 <= b.x0 and b.x1 <= area.x1 and area.y0 <= b.y0 and b.y1 <= area.y1
                   for b in boxes)  # fmt: skip


def test_the_same_report_draws_the_same_svg(two_bounds: Path) -> None:
    from infertune_tuner.report import render_html

    report = Report.model_validate_json((two_bounds / "report.json").read_text())
    assert render_html(report) == render_html(report)


def test_a_report_from_before_measured_still_plots_one_point_per_configuration(
    dense: Path, tmp_path: Path
) -> None:
    """`infertune report` may fetch a report an older tuner wrote (no `measured`, no
    `near_ties`): it still renders, one uniquely labelled point per configuration."""
    from infertune_tuner.run import write_report

    data = json.loads((dense / "report.json").read_text())
    for key in ("measured", "near_ties", "p_untried_beats"):
        data.pop(key)
    write_report(Report.model_validate(data), tmp_path)
    (svg,) = _svgs(tmp_path)
    labels = _labels(svg)
    configs = {json.dumps(t["config"], sort_keys=True) for t in data["trials"] if t["metrics"]}
    assert len(labels) == len(set(labels)) == len(configs)
    for vertex in _front(svg):
        assert any(_near(vertex, m) for m in _markers(svg, "-meets-slo"))


def test_a_study_of_hundreds_of_configurations_labels_the_ones_that_matter() -> None:
    """A thousand-trial study still gets a readable plot: the chosen configuration, the front
    and the fastest are labelled (plot.MAX_LABELS of them), the rest are markers, and the page
    says so."""
    from infertune_tuner.report.plot import MAX_LABELS, plot_svg
    from infertune_tuner.report.view import Plot, Point
    from infertune_tuner.request import SloBound
    from infertune_tuner.result import ConfigOut

    points = []
    for tp, b in itertools.product((1, 2, 4, 8), range(1, 76)):
        cfg = ConfigOut(tp=tp, max_batch_size=b, quantization="fp8", kv_cache_dtype="auto")
        latency, tps = 100.0 * b, 50.0 * b / tp**0.5  # TP1 holds the front: batch 1-20
        points.append(Point(cfg, f"tp{tp}/bs{b}/fp8/kv-auto", latency, tps, latency <= 2000,
                            chosen=(tp, b) == (1, 20)))  # fmt: skip
    feasible = sorted((p for p in points if p.slo_ok), key=lambda p: p.latency_ms)
    front = [p for p in feasible if all(q.tps <= p.tps for q in feasible
                                        if q.latency_ms <= p.latency_ms)]  # fmt: skip
    plot = Plot(SloBound(metric="e2e_ms", percentile="p95", max_ms=2000), points, front)
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    parser.feed(plot_svg(plot, title="many", gid="pareto0"))
    labels = _labels(parser.close())
    assert len(points) == 300 and len(labels) == len(set(labels)) == MAX_LABELS
    assert "tp1/bs20/fp8/kv-auto" in labels and len(front) == 20  # the chosen one, the front
    assert {p.label for p in front} <= set(labels)
