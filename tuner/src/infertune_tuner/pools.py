"""The pool dimension: which GPUs a configuration runs on, what an hour of them costs, and the
one objective that compares configurations across pools.

- **One pool** (`gpu.product`): the objective is output tok/s/GPU, as it always was.
- **Several pools** (`gpu.pools`, each priced): the objective is the cost of a million output
  tokens, price per GPU-hour / (tok/s/GPU x 3600) x 1e6, lowest wins; the SLO is met as on one
  pool. The search ranks by tok/s/GPU x `worth`, worth = the cheapest pool's price / the
  configuration's pool's price: the tok/s/GPU it would make at the cheapest price. That orders
  configurations exactly as their cost does, is the tok/s/GPU itself on one pool (worth 1), and
  leaves every ratio the search reasons in (the model's error, the 2 % that counts as better)
  what it was.
"""

from __future__ import annotations

from infertune_tuner.catalog.gpus import Gpu, get_gpu
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import GpuRef, TuningRequest

TOKENS_PER_COST_UNIT = 1e6  # costs are per million output tokens


def products(request: TuningRequest) -> tuple[str, ...]:
    """The pools' products, in the request's order; () for a one-pool request."""
    return tuple(p.product for p in request.gpu.pools)


def gpu_of(request: TuningRequest, cfg: TrialConfig) -> Gpu:
    """The GPU `cfg` runs on: its pool's, else the request's one product."""
    return get_gpu(cfg.gpu or request.gpu.product)


def price_of(request: TuningRequest, product: str) -> float | None:
    """A pool's price per GPU-hour (None: not a pool of the request, or unpriced)."""
    return next((p.price_per_gpu_hour for p in request.gpu.pools if p.product == product), None)


def worth(request: TuningRequest, cfg: TrialConfig) -> float:
    """What one tok/s/GPU of `cfg` is worth against the cheapest pool's: 1 on one pool."""
    if not cfg.gpu or not request.gpu.pools:
        return 1.0
    price, cheapest = price_of(request, cfg.gpu), cheapest_price(request)
    return cheapest / price if price and cheapest else 1.0


def value(request: TuningRequest, cfg: TrialConfig, tps: float) -> float:
    """The objective the search maximises: `cfg`'s tok/s/GPU `tps` x its worth."""
    return tps * worth(request, cfg)


def cost_per_million(price_per_gpu_hour: float | None, tps: float) -> float | None:
    """Dollars (the price's unit) per million output tokens at `tps` output tok/s/GPU."""
    if price_per_gpu_hour is None or tps <= 0:
        return None
    return price_per_gpu_hour / (tps * 3600.0) * TOKENS_PER_COST_UNIT


def single(request: TuningRequest, product: str) -> TuningRequest:
    """`request` on the one pool `product` (what a backend that measures that pool sees)."""
    own = next((p.max_gpus_per_replica for p in request.gpu.pools if p.product == product), None)
    gpu = GpuRef(product=product, max_gpus_per_replica=own or request.gpu.max_gpus_per_replica)
    return request.model_copy(update={"gpu": gpu})


def cheapest_price(request: TuningRequest) -> float | None:
    """The lowest price per GPU-hour among the pools (None on one pool)."""
    prices = [p.price_per_gpu_hour for p in request.gpu.pools if p.price_per_gpu_hour]
    return min(prices) if prices else None


def beats(request: TuningRequest, objective: float) -> str:
    """'beats X' for an objective value as a user reads it: tok/s/GPU on one pool; on several,
    'undercuts' the cost per million output tokens (at the cheapest pool's price, which is what
    `worth` scales to)."""
    cost = cost_per_million(cheapest_price(request), objective)
    if cost is None:
        return f"beats {objective:.0f} tok/s/GPU"
    return f"undercuts ${cost:.3g} per 1M output tokens"
