"""The search: which configuration to measure next, when to stop, and how sure to be.

`AutoSampler` (sampler.py) is an Optuna sampler handed to `optuna.create_study`. Read the
package top-down, in the order a decision flows:

- `evidence`: what the study holds (measurements, what is in flight, recorded decisions);
- `posterior`: what the evidence says about every configuration (its verdict, its chances);
- `planner`: the decision (explore, cover, confirm, probe) and the one stop rule;
- `sampler`: the samplers that make those decisions inside an Optuna study;
- `driver`: runs the study's trials and records what they measured;
- `settings` (every constant, with its evidence) and `hyperprior` (the posterior's prior,
  fitted across worlds).
"""

from infertune_tuner.search.sampler import AutoSampler

__all__ = ["AutoSampler"]
