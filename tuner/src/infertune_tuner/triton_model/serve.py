"""Build the serving loop a version folder's files describe (model.py's `initialize`, testable
alone)."""

from __future__ import annotations

from infertune_tuner.catalog.gpus import get_gpu
from infertune_tuner.harness.engine import Engine, oom_message
from infertune_tuner.perfmodel.latency import StepModel
from infertune_tuner.triton_model.loop import Body, OnError, OnToken, ServingLoop, SimulatedBody
from infertune_tuner.triton_model.spec import Served


def build_loop(served: Served, on_token: OnToken, on_error: OnError) -> ServingLoop:
    """The engine + body for the repository's model.yaml and body.json (`spec.read`; not
    started).

    Both bodies schedule with the same engine (admission by max batch, KV pages and the step's
    token budget); the simulated one also takes its step times from it, the PyTorch one runs
    the step and its KV cache sets the capacity."""
    arch, config = served.spec.model_arch(), served.config
    gpu = get_gpu(served.spec.gpu)
    engine = Engine.for_config(arch, gpu, config, served.spec.time_scale)
    engine.max_num_tokens = served.max_num_tokens
    body: Body
    if served.spec.body == "torch":
        from infertune_tuner.triton_model.torch_body import TorchBody

        torch_body = TorchBody(arch, config, served.spec.max_context)
        engine = Engine(
            steps=StepModel(arch, gpu, config),
            max_batch_size=config.max_batch_size,
            kv_capacity=torch_body.kv_capacity_tokens,
            max_num_tokens=served.max_num_tokens,
        )
        body = torch_body
    else:
        message = oom_message(arch, gpu, config)
        if message is not None:  # the weights do not fit: fail to load as the real model would
            raise MemoryError(message)
        body = SimulatedBody()
    return ServingLoop(engine, body, on_token, on_error)
