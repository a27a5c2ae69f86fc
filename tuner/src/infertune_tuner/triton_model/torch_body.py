"""A Llama-shaped decoder in PyTorch with random weights: real GPU steps for the serving loop.

The model is the catalog architecture's shape (layers, hidden size, heads, grouped KV heads,
gated MLP, vocabulary, untied LM head) with random weights: what is measured is the cost of the
computation, not the text. It is plain PyTorch, not a tuned engine:

- weights in bf16 (`bf16`), fp16 (`fp16`) or FP8 E4M3 with one scale per tensor (`fp8`, through
  `torch._scaled_mm`; activations quantized per tensor at every matmul); other quantizations are
  refused; the input embedding stays 16-bit;
- a KV cache of `max_batch_size` slots x `max_context` tokens per layer, in the activations'
  16-bit dtype (`auto`) or FP8 E4M3 (`fp8`, dequantized on read): allocated at start, so a cache
  that does not fit is a CUDA out-of-memory at load time, as TensorRT-LLM's would be;
- a step first decodes one token for every slot (masked attention over the whole context; slots
  that are not decoding compute and discard), captured once in a CUDA graph and replayed (as
  TensorRT-LLM's PyTorch backend pads a batch to a captured graph); then prefills the prompts
  admitted in the step, eagerly, grouped by length (causal attention); greedy sampling from the
  LM head's logits. No rotary embedding: its cost is negligible next to the matmuls.

Tensor parallelism is not modelled: one process drives one GPU, so tp > 1 is refused.
"""

from __future__ import annotations

from typing import Any

from infertune_tuner.catalog.llms import ModelArch
from infertune_tuner.config import TrialConfig
from infertune_tuner.harness.engine import Engine, Sequence

INIT_STD = 0.02  # random weights: a typical initializer's scale keeps activations finite
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MM_ALIGN = 16  # torch._scaled_mm wants every dimension a multiple of 16
NORM_EPS = 1e-5
GRAPH_WARMUP = 2  # eager runs on a side stream before capture, as torch.cuda.graphs documents


class TorchBody:
    """See the module docstring. `torch` is imported here only: the package never needs it."""

    def __init__(self, arch: ModelArch, config: TrialConfig, max_context: int,
                 device: str = "cuda", graphs: bool = True) -> None:  # fmt: skip
        import torch

        if config.tp != 1:
            raise ValueError(f"the PyTorch body runs one GPU; tp{config.tp} is not served")
        if config.quantization not in ("bf16", "fp16", "fp8"):
            raise ValueError(
                f"the PyTorch body serves bf16, fp16 and fp8 weights, not {config.quantization}"
            )
        if arch.experts > 1:
            raise ValueError("the PyTorch body serves dense models only")
        self.torch = torch
        self.arch, self.device = arch, torch.device(device)
        self.act = torch.float16 if config.quantization == "fp16" else torch.bfloat16
        self.fp8 = config.quantization == "fp8"
        self.kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype == "fp8" else self.act
        self.slots = config.max_batch_size
        self.max_context = max_context
        self.slot_of: dict[Sequence, int] = {}
        self.free = list(range(self.slots - 1, -1, -1))
        gen = torch.Generator(device=self.device).manual_seed(0)
        h, q, kv = arch.hidden_size, arch.q_size, arch.kv_heads * arch.head_dim
        self.embed = self._param((arch.vocab_size, h), gen, quantize=False)
        self.lm_head = self._param((arch.vocab_size, h), gen)
        self.layers = [
            {
                "qkv": self._param((q + 2 * kv, h), gen),
                "o": self._param((h, q), gen),
                "up_gate": self._param((2 * arch.ffn_size, h), gen),
                "down": self._param((h, arch.ffn_size), gen),
                "norm1": torch.ones(h, dtype=self.act, device=self.device),
                "norm2": torch.ones(h, dtype=self.act, device=self.device),
            }
            for _ in range(arch.layers)
        ]
        shape = (self.slots, arch.kv_heads, max_context, arch.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
                        for _ in range(arch.layers)]  # fmt: skip
        self.v_cache = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
                        for _ in range(arch.layers)]  # fmt: skip
        # The decode step's inputs, updated in place before each replay. A slot that does not
        # decode attends to its first position and writes the last one, which no request reads
        # (a request's last decode writes position input + max_tokens - 2 < max_context - 1).
        self.last_token = torch.zeros(self.slots, dtype=torch.long, device=self.device)
        self.positions = torch.full(
            (self.slots,), max_context - 1, dtype=torch.long, device=self.device
        )
        self.lengths = torch.ones(self.slots, dtype=torch.long, device=self.device)
        self.all_slots = torch.arange(self.slots, device=self.device)
        self.context_index = torch.arange(max_context, device=self.device)
        self.graph: Any = None
        if graphs and self.device.type == "cuda":
            self.graph = self._capture()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the cache holds: every slot a whole `max_context`."""
        return self.slots * self.max_context

    # ------------------------------------------------------------------ weights and matmuls
    def _param(self, shape: tuple[int, int], gen: Any, *, quantize: bool = True) -> Any:
        torch = self.torch
        w = torch.randn(shape, generator=gen, device=self.device, dtype=self.act) * INIT_STD
        if not (self.fp8 and quantize):
            return w
        scale = w.abs().max().float() / FP8_MAX
        return (w.float() / scale).to(torch.float8_e4m3fn), scale

    def _linear(self, x: Any, w: Any) -> Any:
        """x [m, k] @ w.T (w [n, k] 16-bit, or (fp8 tensor, scale))."""
        torch = self.torch
        if not isinstance(w, tuple):
            return x @ w.t()
        wq, w_scale = w
        m = x.shape[0]
        pad = -m % MM_ALIGN
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        x_scale = (x.abs().max().float() / FP8_MAX).clamp(min=1e-12)
        xq = (x.float() / x_scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=self.act)
        return out[:m] if pad else out

    def _norm(self, x: Any, weight: Any) -> Any:
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)

    def _mlp(self, x: Any, layer: dict[str, Any]) -> Any:
        up, gate = self._linear(x, layer["up_gate"]).chunk(2, dim=-1)
        return self._linear(self.torch.nn.functional.silu(gate) * up, layer["down"])

    def _split_qkv(self, x: Any, layer: dict[str, Any]) -> tuple[Any, Any, Any]:
        a = self.arch
        q, k, v = self._linear(x, layer["qkv"]).split(
            [a.q_size, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim], dim=-1
        )
        return q, k, v

    def _store(self, cache: Any, where: tuple[Any, ...], values: Any) -> None:
        """cache[where] = values in the cache's dtype (FP8 through a byte view: indexed writes
        are not implemented for float8 tensors)."""
        if self.kv_dtype == self.act:
            cache[where] = values
        else:
            u8 = self.torch.uint8
            cache.view(u8)[where] = values.to(self.kv_dtype).view(u8)

    # ------------------------------------------------------------------ one engine step
    def step(self, engine: Engine, admitted: list[Sequence]) -> None:
        torch = self.torch
        with torch.inference_mode():
            fresh = set(admitted)
            decoding = [s for s in engine.active if s not in fresh]
            if decoding:
                self._decode(decoding)
            for seq in admitted:
                self.slot_of[seq] = self.free.pop()
            by_length: dict[int, list[Sequence]] = {}
            for seq in admitted:
                by_length.setdefault(seq.input_tokens, []).append(seq)
            for length, group in by_length.items():
                self._prefill(group, length)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

    def release(self, seq: Sequence) -> None:
        slot = self.slot_of.pop(seq, None)
        if slot is not None:
            self.free.append(slot)

    def _prefill(self, group: list[Sequence], length: int) -> None:
        """Causal attention over the prompts of `group` (all `length` tokens long)."""
        torch, a = self.torch, self.arch
        if length > self.max_context:
            raise ValueError(f"a {length}-token prompt exceeds the cache's {self.max_context}")
        n = len(group)
        slots = torch.tensor([self.slot_of[s] for s in group], device=self.device)
        ids = torch.randint(0, a.vocab_size, (n, length), device=self.device)
        x = self.embed[ids].reshape(n * length, a.hidden_size)
        for i, layer in enumerate(self.layers):
            q, k, v = self._split_qkv(self._norm(x, layer["norm1"]), layer)
            q = q.view(n, length, a.heads, a.head_dim).transpose(1, 2)
            k = k.view(n, length, a.kv_heads, a.head_dim).transpose(1, 2)
            v = v.view(n, length, a.kv_heads, a.head_dim).transpose(1, 2)
            self._store(self.k_cache[i], (slots, slice(None), slice(0, length)), k)
            self._store(self.v_cache[i], (slots, slice(None), slice(0, length)), v)
            att = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )
            att = att.transpose(1, 2).reshape(n * length, a.q_size)
            x = x + self._linear(att, layer["o"])
            x = x + self._mlp(self._norm(x, layer["norm2"]), layer)
        last = x.view(n, length, a.hidden_size)[:, -1]
        self.last_token[slots] = self._linear(last, self.lm_head).argmax(-1)

    def _decode(self, seqs: list[Sequence]) -> None:
        """One token for each of `seqs` (and a discarded one for every other slot)."""
        torch = self.torch
        positions = [self.max_context - 1] * self.slots
        lengths = [1] * self.slots
        for s in seqs:
            slot = self.slot_of[s]
            positions[slot], lengths[slot] = s.context - 1, s.context
        self.positions.copy_(torch.tensor(positions), non_blocking=False)
        self.lengths.copy_(torch.tensor(lengths), non_blocking=False)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._decode_all()

    def _decode_all(self) -> None:
        """The decode step over every slot, with fixed shapes (what the CUDA graph captures)."""
        torch, a, m = self.torch, self.arch, self.slots
        mask = (self.context_index[None, :] < self.lengths[:, None])[:, None, None, :]
        x = self.embed[self.last_token]
        where = (self.all_slots, slice(None), self.positions)
        for i, layer in enumerate(self.layers):
            q, k, v = self._split_qkv(self._norm(x, layer["norm1"]), layer)
            self._store(self.k_cache[i], where, k.view(m, a.kv_heads, a.head_dim))
            self._store(self.v_cache[i], where, v.view(m, a.kv_heads, a.head_dim))
            keys, values = self.k_cache[i], self.v_cache[i]
            if self.kv_dtype != self.act:
                keys, values = keys.to(self.act), values.to(self.act)
            att = torch.nn.functional.scaled_dot_product_attention(
                q.view(m, a.heads, 1, a.head_dim), keys, values, attn_mask=mask, enable_gqa=True
            )
            x = x + self._linear(att.reshape(m, a.q_size), layer["o"])
            x = x + self._mlp(self._norm(x, layer["norm2"]), layer)
        self.last_token.copy_(self._linear(x, self.lm_head).argmax(-1))

    def _capture(self) -> Any:
        """The decode step as a CUDA graph; None (eager steps, logged) where capture fails."""
        torch = self.torch
        try:
            with torch.inference_mode():
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(GRAPH_WARMUP):
                        self._decode_all()
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._decode_all()
            return graph
        except RuntimeError as exc:  # the server's log says so (the stub's stdout goes there)
            print(f"infertune: decode steps run eagerly: CUDA graph capture failed: {exc}",
                  flush=True)  # fmt: skip
            return None
