"""The benchmark's oracle (benchmarks/oracle.py): `auto` with explorations that know the truth.

Its trial counts are the argument that a family's proof cannot be shortened by choosing trials
better, so it must do what it says: measure the optimum first and otherwise keep `auto`'s
posterior, stop rule and claims.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from oracle import MODES, Mode  # noqa: E402
from tuner_efficiency import Run, run_world  # noqa: E402
from worldset import Truth, World, truth_of, worlds  # noqa: E402

from infertune_tuner.search.hyperprior import default_hyperprior  # noqa: E402


@pytest.fixture(scope="module")
def synthetic_07() -> tuple[World, Truth, Run]:
    """A development-set world whose model is 2-8x off for w4a16, and plain `auto` on it: it
    finds the optimum late (trial 8-14 of 20-22)."""
    world = next(w for w in worlds(["dev-synthetic"], 1) if w.name == "synthetic-07")
    truth = truth_of(world)
    [(label, plain, _)] = run_world(world, truth, ["auto"], 40, default_hyperprior())
    assert label == "auto"
    return world, truth, plain


@pytest.mark.parametrize("mode", MODES)
def test_the_oracle_measures_the_optimum_first_and_claims_what_auto_would(
    synthetic_07: tuple[World, Truth, Run], mode: Mode
) -> None:
    world, truth, plain = synthetic_07
    [(label, run, _)] = run_world(world, truth, ["auto"], 40, default_hyperprior(), None, mode)
    assert label == f"auto-oracle-{mode}"
    assert plain.found_at is not None and plain.found_at > 1
    assert run.found_at == 1
    assert run.reached
    # Same posterior, same stop rule: it stops only once it can claim the confidence target.
    assert run.confidence is not None and run.confidence >= 0.95
    assert run.executed < plain.executed
