"""A model with no weights anywhere (a custom architecture, no source) is tuned on the simulated
pool and refused for real trials: a condition and an event, never an exception in a handler."""

from __future__ import annotations

from .apiserver import (
    FakeApiServer,
    OperatorRunner,
    condition,
    create,
    get,
    jobs_of,
    manifest,
    patch,
    phase,
    wait_for,
    warning_events,
)

ARCH = {"layers": 32, "hiddenSize": 4096, "heads": 32, "kvHeads": 8, "ffnSize": 14336,
        "vocabSize": 128256}  # fmt: skip


async def test_a_model_with_no_weights_is_refused_for_real_trials_and_tuned_simulated(
    api: FakeApiServer, operator: OperatorRunner
) -> None:
    custom = {"name": "my-model", "architecture": ARCH}
    await create(api, manifest("custom", model=custom, tuning={"backend": "triton"}))
    await wait_for(lambda: phase(api, "custom") == "Failed", what="phase Failed")
    obj = get(api, "inferencedeployments", "custom")
    assert obj is not None
    tuned = condition(obj, "Tuned")
    assert tuned["reason"] == "InvalidSpec"
    assert "spec.model.source.uri: no weights to load for 'my-model'" in tuned["message"]
    await warning_events(api, "custom", "InvalidSpec")
    assert jobs_of(api, "custom") == []

    # On the simulated pool nothing loads weights: the same model tunes.
    await patch(
        api, "inferencedeployments", "custom", {"spec": {"tuning": {"backend": "simulated"}}}
    )
    await wait_for(lambda: len(jobs_of(api, "custom")) == 1, what="a tuner Job")
