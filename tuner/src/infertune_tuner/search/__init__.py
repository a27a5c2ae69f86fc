"""The search: what to measure next, when to stop, how sure to be (docs/tuning.md).

Organised like Optuna's own samplers (`optuna/samplers/_tpe/`, `_gp/`), top to bottom:

- `driver`: the Optuna study driven by `study.optimize`: claims, workers, the budget, resume;
- `untried`: why each configuration that was not measured was not (for the report);
- `samplers`: the `auto` sampler (handed to `create_study`; it decides from the study's trials
  alone) and the guard around Optuna's TPE, random and grid samplers;
- `records`: what each trial holds in the study, and reading the study back as evidence;
- `planner`: the model-guided decision (next trial, confirmation, stop rule, confidence);
- `belief`: trials in flight believed at their posterior mean (batch proposals);
- `evidence` | `model` | `memory_fit`: what was measured and what it rules out; the posterior
  of the performance model's errors; the memory frontier as a probability.
"""
