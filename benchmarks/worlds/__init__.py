"""Simulated GPU pools whose behaviour differs in *form* from the tuner's performance model.

The tuner benchmark (worldset.py, tuner_efficiency.py) and tests use them to check that the
search stays right when the pool bends the curves in ways the prior does not know (see
families.py for what each family stands for). They are not a product backend: a tuning runs
against one as an instance, `tune(request, backend=WorldBackend(request, family), ...)`. The
`failing` family (failures.py) is the `mixed` physics with whole structures that fail.
"""

from worlds.backend import WorldBackend
from worlds.failures import FAILING
from worlds.families import FAMILIES

__all__ = ["FAILING", "FAMILIES", "WorldBackend"]
