"""The Pareto plot (tok/s/GPU vs the binding latency percentile, with the SLO line) as inline SVG."""

from __future__ import annotations

import io

from infertune_tuner.report.view import View


def pareto_svg(view: View) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    try:
        ok = [p for p in view.points if p.slo_ok]
        bad = [p for p in view.points if not p.slo_ok]
        ax.scatter(
            [p.latency_ms for p in ok],
            [p.tps for p in ok],
            c="#2a9d8f",
            label="meets SLO",
            zorder=3,
        )
        ax.scatter(
            [p.latency_ms for p in bad],
            [p.tps for p in bad],
            c="#e76f51",
            marker="x",
            label="misses SLO",
            zorder=3,
        )
        front = sorted((p for p in view.points if p.pareto), key=lambda p: p.latency_ms)
        if front:
            ax.plot(
                [p.latency_ms for p in front],
                [p.tps for p in front],
                c="#264653",
                lw=1,
                ls="--",
                label="Pareto front",
                zorder=2,
            )
        for p in view.points:
            c = p.trial.config
            ax.annotate(
                f"tp{c.tp}/bs{c.max_batch_size}/{c.quantization}",
                (p.latency_ms, p.tps),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
        ax.axvline(view.binding.max_ms, c="#e63946", lw=1.5, label=f"SLO {view.binding.label()}")
        best = view.report.best
        if best is not None:
            ax.scatter(
                [best.metrics.latency(view.binding.metric, view.binding.percentile)],
                [best.metrics.output_tokens_per_s_per_gpu],
                s=220,
                facecolors="none",
                edgecolors="#1d3557",
                lw=2,
                label="chosen",
                zorder=4,
            )
        ax.set_xlabel(view.axis_label)
        ax.set_ylabel("output tokens/s per GPU")
        ax.set_title("Throughput vs latency of executed trials")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]
