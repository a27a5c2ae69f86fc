"""infertune's own Triton Python-backend model: the LLM-API model's interface, a body behind it.

A real `tritonserver` (the `nvidia-pytriton` wheel's, see `runtime/local_triton.py`) serves the
model repository infertune renders for TensorRT-LLM (the same `config.pbtxt` and `model.yaml`);
only `model.py` is ours. It takes the LLM-API model's inputs and streams one response per token,
the last flagged final, from a continuous-batching loop (`loop.py`, scheduled by the simulated
engine's admission rules) around one of two bodies (`body.json`, written next to model.yaml):

- `simulated`: each step lasts what the performance model says (no GPU; CI and demos);
- `torch`: a Llama-shaped PyTorch model with random weights runs each step on the local GPU
  (`torch_body.py`): real kernels, real memory, timings nobody here wrote.
"""
