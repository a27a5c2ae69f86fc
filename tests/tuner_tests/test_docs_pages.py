"""The pages a user looks for: linked from the README, with a real screenshot, covering every
section of a report, and every command in them runs as printed (from a fresh copy of the
examples, as the README's quick start leaves a user)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/reading-reports.md", "docs/troubleshooting.md")
# Every command of the pages' ```bash blocks, and the exit status it is documented with.
EXPECTED = {
    "infertune tune examples/llama3-8b-l4.yaml": 0,
    "infertune export-replay infertune-out/llama3-8b-l4": 0,
    "sed 's/p95: 20000/p95: 25000/' examples/llama3-8b-l4.yaml > l4-looser.yaml": 0,
    "infertune tune l4-looser.yaml --backend replay:infertune-out/llama3-8b-l4/replay.csv "
    "--out infertune-out/l4-looser": 0,
    "infertune tune examples/replay/h100-llama2-13b.yaml "
    "--backend replay:examples/replay/h100-llama2-13b.csv": 0,
    "infertune validate examples/llama2-70b-h100.yaml": 0,
    "sed 's/p95: 25600/p95: 2000/' examples/llama2-70b-h100.yaml > tight.yaml": 0,
    "infertune tune tight.yaml --out infertune-out/tight": 3,  # nothing meets it: the point
    "infertune predict --model llama-2-70b --gpu H100-SXM-80GB --tp 8 --batch 16 --quant fp8 "
    "--isl 1024 --osl 512": 0,
}


def _commands() -> list[str]:
    out = []
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            out += [line.strip() for line in block.splitlines() if line.strip()]
    return out


def test_the_readme_links_both_pages() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert f"]({page})" in readme, page
        assert (REPO / page).is_file()


def test_the_report_page_has_a_real_small_screenshot() -> None:
    text = (REPO / "docs/reading-reports.md").read_text(encoding="utf-8")
    (src,) = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    png = REPO / "docs" / src
    assert png.stat().st_size < 300 * 1024
    with Image.open(png) as im:
        assert im.format == "PNG" and im.width >= 1000 and im.height >= 800


def test_the_report_page_covers_every_section_of_a_report(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from infertune_operator.cli import app

    spec = REPO / "examples" / "llama3-8b-l4.yaml"
    result = CliRunner().invoke(app, ["tune", str(spec), "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    headings = re.findall(r"<h2>([^<]+)</h2>", html) + re.findall(r"<dt>([^<]+)</dt>", html)
    page = (REPO / "docs/reading-reports.md").read_text(encoding="utf-8")
    for heading in headings:
        assert heading in page, heading
    for group in ("memory", "neighbour", "twin", "fit", "slo", "stopped", "posterior"):
        assert f"| {group} |" in page
    for state in ("complete", "oom", "failed", "invalid", "interrupted"):
        assert f"`{state}`" in page


def test_the_pages_list_exactly_the_commands_checked_here() -> None:
    assert _commands() == list(EXPECTED), _commands()


@pytest.mark.skipif(shutil.which("sed") is None, reason="the pages use sed")
def test_every_command_runs_as_printed(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command, code in EXPECTED.items():
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == code, f"{command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stdout + done.stderr, command
    # What the pages say these commands show.
    looser = (tmp_path / "infertune-out/l4-looser/report.md").read_text()
    assert "**Best: TP1, max batch 96, w4a8_awq, KV fp8 -> 1249 output tok/s/GPU" in looser
    l4 = (tmp_path / "infertune-out/llama3-8b-l4/report.json").read_text()
    assert '"confidence": 0.7826' in l4 and '"p_untried_beats": 0.0221' in l4
