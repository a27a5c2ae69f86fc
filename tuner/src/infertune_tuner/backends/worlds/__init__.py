"""Simulated GPU pools whose behaviour differs in *form* from the tuner's performance model.

Tests and benchmarks use them to check that the search stays right when the pool bends the
curves in ways the prior does not know (see families.py for what each family stands for).
`infertune tune --backend world:FAMILY` runs a tuning against one of them.
"""

from infertune_tuner.backends.worlds.backend import WorldBackend
from infertune_tuner.backends.worlds.families import FAMILIES

__all__ = ["FAMILIES", "WorldBackend"]
