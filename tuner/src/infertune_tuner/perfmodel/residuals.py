"""Predicted vs published for every calibration point, and the Markdown tables
`benchmarks/calibrate.py` prints and writes into docs/performance-model.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from infertune_tuner.metrics import E2E
from infertune_tuner.perfmodel.factors import BORROWED, STACKS, Efficiency
from infertune_tuner.perfmodel.fit import FITS, PER_GENERATION, SHARED, generation
from infertune_tuner.perfmodel.points import Point, SpeedupPoint

UNITS = {
    "allreduce_latency_us": "µs", "step_overhead_ms": "ms", "per_seq_overhead_us": "µs",
    "context_step_overhead_ms": "ms",
}  # fmt: skip


@dataclass(frozen=True)
class Residual:
    point: Point
    published: float
    predicted: float | None  # None: predicted not to fit in memory
    e2e: tuple[float, float] | None = None  # (published, predicted) E2E ms of closed-loop points

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.published - 1

    @property
    def e2e_error(self) -> float | None:
        return None if self.e2e is None else self.e2e[1] / self.e2e[0] - 1


def residuals(
    factors: Mapping[str, Mapping[str, Efficiency]], points: Iterable[Point] | None = None
) -> list[Residual]:
    """Every point of every stack under `factors` ({stack: {generation: Efficiency}})."""
    out = []
    for fit in FITS.values():
        for p in points if points is not None else fit.points:
            if p.source.stack != fit.stack:
                continue
            effs = factors[fit.stack]
            eff = effs[BORROWED[fit.stack][generation(p)]]
            if isinstance(p, SpeedupPoint):
                out.append(Residual(p, p.speedup, p.predict(eff)))
                continue
            pred = p.predict(eff)
            e2e = None
            if p.published_latency_ms is not None and pred is not None:
                e2e = (p.published_latency_ms, E2E.of(pred).p50)
            tps = pred.output_tokens_per_s_per_gpu if pred is not None else None
            out.append(Residual(p, p.tokens_per_s_per_gpu, tps, e2e))
    return out


def _pct(x: float | None) -> str:
    return "does not fit" if x is None else f"{x:+.0%}"


def _num(x: float) -> str:
    return f"{x:.3g}" if x < 10 else f"{x:,.0f}"


def _summary(rows: Sequence[Residual]) -> str:
    errs = [abs(r.error) for r in rows if r.error is not None]
    if not errs:
        return "no prediction fits"
    mean = sum(errs) / len(errs)
    return f"{len(errs)} points, mean |error| {mean:.1%}, max |error| {max(errs):.1%}"


def factor_table(factors: Mapping[str, Mapping[str, Efficiency]]) -> str:
    cols = [(s, g) for s, fit in FITS.items() for g in fit.generations]
    head = "| factor | " + " | ".join(f"{s} {g}" for s, g in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for k in (*PER_GENERATION, *SHARED):
        unit = UNITS.get(k, "")
        vals = [f"{getattr(factors[s][g], k):.4g}{(' ' + unit) if unit else ''}" for s, g in cols]
        lines.append(f"| {k} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def markdown(factors: Mapping[str, Mapping[str, Efficiency]]) -> str:
    """The factor table, then per stack, source and GPU: predicted vs published with the error."""
    rows = residuals(factors)
    out = ["#### Fitted factors", "", factor_table(factors), ""]
    for stack in FITS:
        borrowed = ", ".join(f"{g} uses {src}" for g, src in BORROWED[stack].items() if g != src)
        out += [f"#### Stack `{stack}`: {STACKS[stack]}", "", f"Borrowed: {borrowed}.", ""]
        mine = [r for r in rows if r.point.source.stack == stack]
        groups: dict[tuple[str, str, bool], list[Residual]] = {}
        for r in mine:
            kind = isinstance(r.point, SpeedupPoint)
            groups.setdefault((r.point.source.key, r.point.gpu, kind), []).append(r)
        for (_, gpu, _), group in groups.items():
            src = group[0].point.source
            out += [
                f"**{src.title}** — {gpu}, {src.role} ({_summary(group)}). Source: {src.where}",
                "",
            ]
            if isinstance(group[0].point, SpeedupPoint):
                out += ["| model | TP | batch | ISL/OSL | metric | published FP16/FP8 | predicted | error |",
                        "|---|---|---|---|---|---|---|---|"]  # fmt: skip
                for r in group:
                    p = r.point
                    assert isinstance(p, SpeedupPoint)
                    out.append(
                        f"| {p.model} | {p.tp} | {p.batch} | {p.input_tokens}/{p.output_tokens} | "
                        f"{p.metric.upper()} | {r.published:.3f} | {r.predicted or 0:.3f} | "
                        f"{_pct(r.error)} |"
                    )
            else:
                out += ["| model | quant | TP | ISL/OSL | load | published tok/s/GPU | predicted | error |",
                        "|---|---|---|---|---|---|---|---|"]  # fmt: skip
                for r in group:
                    p = r.point
                    assert not isinstance(p, SpeedupPoint)
                    load = "max" if p.batch is None else f"bs {p.batch}"
                    e2e = f" (E2E {_pct(r.e2e_error)})" if r.e2e is not None else ""
                    pred = "—" if r.predicted is None else _num(r.predicted)
                    out.append(
                        f"| {p.model} | {p.quantization} | {p.tp} | "
                        f"{p.input_tokens}/{p.output_tokens} | {load} | {_num(r.published)} | "
                        f"{pred} | {_pct(r.error)}{e2e} |"
                    )
            out.append("")
        for role in ("fit", "holdout"):
            chosen = [
                r
                for r in mine
                if r.point.source.role == role and not isinstance(r.point, SpeedupPoint)
            ]
            if chosen:
                out.append(f"- `{stack}` {role} throughput: {_summary(chosen)}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
