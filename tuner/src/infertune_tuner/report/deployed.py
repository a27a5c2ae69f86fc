"""After deploy: the tuned numbers beside what the serving pods measured (the verification) and
what they see live (the observed workload), as `infertune report NAME` appends them to
report.md and report.html. The operator fills :class:`Deployed` from the InferenceDeployment's
status; the tuner knows nothing of Kubernetes."""

from __future__ import annotations

from html import escape

from pydantic import Field

from infertune_tuner.schema import Record


class DeployedRow(Record):
    quantity: str  # "input tokens (mean)", "TTFT p95 (ms)"
    tuned: float | None = None
    verified: float | None = None
    observed: float | None = None


class Deployed(Record):
    config: str  # the configuration serving
    tuned_for: str  # "256 in / 32 out, concurrency 16 (the tuning 1a2b3c4d)"
    rows: list[DeployedRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # "Verified: MatchesTuned - ...", drift


def _cell(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def markdown(d: Deployed) -> str:
    lines = [
        "## After deploy",
        "",
        f"Serving {d.config}, tuned for {d.tuned_for}.",
        "",
        "| quantity | tuned | verified | observed live |",
        "|---|---|---|---|",
        *(
            f"| {r.quantity} | {_cell(r.tuned)} | {_cell(r.verified)} | {_cell(r.observed)} |"
            for r in d.rows
        ),
        "",
        *(f"- {n}" for n in d.notes),
    ]
    return "\n".join(lines).rstrip() + "\n"


def html(d: Deployed) -> str:
    rows = "".join(
        f"<tr><td>{escape(r.quantity)}</td><td>{_cell(r.tuned)}</td><td>{_cell(r.verified)}</td>"
        f"<td>{_cell(r.observed)}</td></tr>"
        for r in d.rows
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in d.notes)
    return (
        f'<section id="after-deploy"><h2>After deploy</h2><p>Serving {escape(d.config)}, tuned '
        f"for {escape(d.tuned_for)}.</p><table><thead><tr><th>quantity</th><th>tuned</th>"
        f"<th>verified</th><th>observed live</th></tr></thead><tbody>{rows}</tbody></table>"
        f"<ul>{notes}</ul></section>"
    )
