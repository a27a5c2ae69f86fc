"""Report renderers: Markdown and self-contained HTML (with an inline SVG Pareto plot)."""

from infertune_tuner.report.html import render_html
from infertune_tuner.report.markdown import render_markdown

__all__ = ["render_html", "render_markdown"]
