"""Several GPU pools measured from one process (`spec.gpu.pools` on `simulated` or `replay:`):
each configuration goes to the backend of its pool, which sees it as a one-pool configuration.

`replay:PRODUCT=TABLE,PRODUCT=TABLE` names a table per pool; `simulated` and
`simulated:perturbed` simulate every pool, each with a noise (and, perturbed, a truth) of its
own. Real trials run on a pool's own nodes, one tuner process per pool, so a triton backend
never spans pools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from infertune_tuner import pools
from infertune_tuner.backends.base import BenchmarkBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.errors import InputError
from infertune_tuner.measurement import Measurement
from infertune_tuner.request import TuningRequest


class PerPool:
    """Routes each configuration to its pool's backend (see the module doc)."""

    def __init__(self, backends: Mapping[str, BenchmarkBackend]) -> None:
        self.backends = dict(backends)
        first = next(iter(self.backends.values()))
        self.name = first.name
        self.speedup = first.speedup

    def run(self, config: TrialConfig, *, repeat: int = 0) -> Measurement:
        inner = self.backends.get(config.gpu)
        if inner is None:
            return Measurement.failed("error", f"no backend measures the pool {config.gpu!r}")
        return inner.run(replace(config, gpu=""), repeat=repeat)

    def close(self) -> None:
        for b in self.backends.values():
            b.close()


def replay_parts(spec: str) -> list[tuple[str, str]]:
    """The (product, table) pairs a `replay:` spec names: one ("", TABLE) for `replay:TABLE`,
    one per pool for `replay:PRODUCT=TABLE,PRODUCT=TABLE`."""
    body = spec.removeprefix("replay:")
    if "=" not in body:
        return [("", body)]
    return [
        (product.strip(), table.strip())
        for product, _, table in (part.partition("=") for part in body.split(","))
    ]


def replay_tables(spec: str, request: TuningRequest) -> dict[str, Path]:
    """`replay:PRODUCT=TABLE,...` -> the table of each pool, every pool given exactly one."""
    wanted = pools.products(request)
    out: dict[str, Path] = {}
    for product, table in replay_parts(spec):
        if not product or not table:
            example = ",".join(f"{p}={p}.csv" for p in wanted)
            raise InputError(
                f"replay backend with several pools: give one table per pool, "
                f"replay:{example} (got {spec!r})"
            )
        if product not in wanted:
            raise InputError(
                f"replay: {product} is not a pool of this spec (its pools: {', '.join(wanted)})"
            )
        if product in out:
            raise InputError(f"replay: two tables for {product}")
        out[product] = Path(table)
    missing = [p for p in wanted if p not in out]
    if missing:
        raise InputError(f"replay: no table for the pool(s) {', '.join(missing)}")
    return out


def per_pool(
    spec: str,
    request: TuningRequest,
    build: Callable[[str, TuningRequest, int], BenchmarkBackend],
    seed: int,
) -> PerPool:
    """The backend of a several-pool request: `build(spec, one-pool request, seed)` per pool,
    or a replay table per pool."""
    if spec.startswith("replay:"):
        from infertune_tuner.backends.replay import ReplayBackend

        return PerPool({p: ReplayBackend(t) for p, t in replay_tables(spec, request).items()})
    if spec not in ("simulated", "simulated:perturbed"):
        raise InputError(
            f"the {spec} backend measures one pool per tuner process; several pools run as one "
            "tuner per pool on a cluster, or locally with --backend simulated or "
            "replay:PRODUCT=TABLE,PRODUCT=TABLE"
        )
    return PerPool({
        p: build(spec, pools.single(request, p), seed + 7919 * i)
        for i, p in enumerate(pools.products(request))
    })  # fmt: skip
