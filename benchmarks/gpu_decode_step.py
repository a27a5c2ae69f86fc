"""Decode-step time of Llama-shaped layers on a real GPU, against the performance model.

The performance model's decode step is a roofline: weights and KV cache streamed from HBM, GEMM
FLOPs on the tensor cores, whichever is longer plus part of the other. This script measures the
same step with PyTorch on random weights (no TensorRT-LLM, no serving stack), so it checks the
*form* of the roofline on real silicon: where decode stops being bandwidth-bound, how much an
FP8 weight GEMM saves at each batch size, and how far plain kernels are from the datasheet.

Two steps, so the GPU machine needs only PyTorch:

    python benchmarks/gpu_decode_step.py measure --out decode.json     # on a GPU, torch only
    python benchmarks/gpu_decode_step.py compare decode.json           # anywhere, infertune

`measure` builds, per case, the decoder layers one tensor-parallel rank runs (attention heads,
KV heads and FFN divided by TP; no all-reduce), captures one decode step (RMSNorm, QKV, GQA
attention over a KV cache of `context` tokens, output projection, gated MLP, LM head) in a CUDA
graph per batch size and times its replays with CUDA events. 16-bit runs use bf16 GEMMs; `fp8`
runs quantise activations per tensor and use FP8 weight GEMMs (`torch._scaled_mm`), attention
and the LM head staying in bf16. Large models are built with fewer layers than they have and
scaled (`layers_built` vs `layers`; the LM head is timed separately and added once).

`compare` predicts the same step with the model's *GPU part* (host overheads set to zero, no
all-reduce): once at datasheet peak ("roofline", every efficiency 1) and once with the
efficiency factors fitted to TensorRT-LLM's published throughput ("fitted"). Results measured on
one H100 are in `benchmarks/results/` and quoted in docs/performance-model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

# name: layers, hidden, heads, kv_heads, head_dim, ffn, vocab (the models' config.json values)
SHAPES: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "llama-3-8b": (32, 4096, 32, 8, 128, 14336, 128256),
    "llama-2-70b": (80, 8192, 64, 8, 128, 28672, 32000),
}
# (model, tp, quantization, layers built, batch sizes, context). ISL 1024 / OSL 512 -> average
# context 1280, the setting of the public Llama-2-70B sweep; 8192 makes the KV cache dominate.
CASES: list[tuple[str, int, str, int, tuple[int, ...], int]] = [
    ("llama-3-8b", 1, "bf16", 32, (1, 4, 8, 16, 32, 64, 128, 256), 1280),
    ("llama-3-8b", 1, "fp8", 32, (1, 4, 8, 16, 32, 64, 128, 256), 1280),
    ("llama-2-70b", 4, "bf16", 20, (1, 8, 32, 64, 128), 1280),
    ("llama-2-70b", 4, "fp8", 20, (1, 8, 32, 64, 128), 1280),
    ("llama-3-8b", 1, "bf16", 8, (8, 32, 64, 128), 8192),
]


# Prefill of one prompt (model, tp, quantization, layers built, prompt lengths): compute-bound,
# the other half of the roofline.
PREFILL_CASES: list[tuple[str, int, str, int, tuple[int, ...]]] = [
    ("llama-3-8b", 1, "bf16", 32, (512, 1024, 2048, 8192)),
    ("llama-3-8b", 1, "fp8", 32, (512, 1024, 2048, 8192)),
    ("llama-2-70b", 4, "bf16", 20, (1024, 4096)),
    ("llama-2-70b", 4, "fp8", 20, (1024, 4096)),
]

# ------------------------------------------------------------------------------- measure (GPU)


def _measure(out: Path, repeats: int) -> None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit("error: `measure` needs PyTorch with CUDA (pip install torch)")
    if not torch.cuda.is_available():
        sys.exit("error: `measure` needs a CUDA GPU; none is visible")
    dev = torch.device("cuda")
    bf16 = torch.bfloat16
    fp8 = torch.float8_e4m3fn
    torch.manual_seed(0)

    def timed(fn: Any, iters: int) -> float:
        """Median ms of `iters` calls of fn, timed with CUDA events."""
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return sorted(times)[len(times) // 2]

    # Achievable HBM bandwidth: a 4 GiB device-to-device copy (read + write).
    def copy_gbs() -> float:
        src = torch.empty(2**31, dtype=bf16, device=dev)
        dst = torch.empty_like(src)
        ms = timed(lambda: dst.copy_(src), 10)
        return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9

    hbm_gbs = copy_gbs()

    class Linear:
        def __init__(self, k: int, n: int, quant: str) -> None:
            w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02
            self.quant = quant
            if quant == "fp8":
                self.w = w.to(fp8)  # [n, k] row-major; .t() is the column-major B _scaled_mm wants
                self.scale = torch.ones((), device=dev, dtype=torch.float32)
            else:
                self.w = w

        def __call__(self, x: Any) -> Any:
            if self.quant != "fp8":
                return x @ self.w.t()
            m = x.shape[0]
            pad = (-m) % 16  # FP8 GEMMs want M a multiple of 16
            xq = F.pad(x, (0, 0, 0, pad)).to(fp8) if pad else x.to(fp8)
            y = torch._scaled_mm(xq, self.w.t(), scale_a=self.scale, scale_b=self.scale,
                                 out_dtype=bf16)  # fmt: skip
            return y[:m] if pad else y

    class Rank:
        """The decoder layers and LM head one tensor-parallel rank runs."""

        def __init__(
            self, model: str, tp: int, quant: str, built: int, max_batch: int, context: int
        ) -> None:
            _, hidden, heads, kv_heads, head_dim, ffn, vocab = SHAPES[model]
            self.hidden, self.head_dim = hidden, head_dim
            self.h, self.kvh, self.f = heads // tp, max(kv_heads // tp, 1), ffn // tp
            self.blocks = [
                {
                    "qkv": Linear(hidden, (self.h + 2 * self.kvh) * head_dim, quant),
                    "o": Linear(self.h * head_dim, hidden, quant),
                    "gate_up": Linear(hidden, 2 * self.f, quant),
                    "down": Linear(self.f, hidden, quant),
                    "k": torch.randn(
                        max_batch, self.kvh, context, head_dim, device=dev, dtype=bf16
                    ),
                    "v": torch.randn(
                        max_batch, self.kvh, context, head_dim, device=dev, dtype=bf16
                    ),
                }
                for _ in range(built)
            ]
            self.lm_head = Linear(hidden, vocab // tp, "bf16")
            self.norm_w = torch.ones(hidden, device=dev, dtype=bf16)

        def layers(self, x: Any) -> Any:
            batch, hd, f = x.shape[0], self.head_dim, self.f
            for blk in self.blocks:
                y = F.rms_norm(x, (self.hidden,), self.norm_w)
                qkv = blk["qkv"](y)
                q = qkv[:, : self.h * hd].view(batch, self.kvh, self.h // self.kvh, hd)
                # GQA decode: a KV head's query heads attend as a query of that many positions
                # (no causal mask: the one new token sees the whole context).
                att = F.scaled_dot_product_attention(q, blk["k"][:batch], blk["v"][:batch])
                x = x + blk["o"](att.reshape(batch, self.h * hd))
                y = F.rms_norm(x, (self.hidden,), self.norm_w)
                gu = blk["gate_up"](y)
                x = x + blk["down"](F.silu(gu[:, :f]) * gu[:, f:])
            return x

        def prefill(self, x: Any) -> Any:
            """One prompt of x.shape[0] tokens through every layer (causal GQA attention)."""
            tokens, hd, f, h, kvh = x.shape[0], self.head_dim, self.f, self.h, self.kvh
            for blk in self.blocks:
                y = F.rms_norm(x, (self.hidden,), self.norm_w)
                qkv = blk["qkv"](y).view(tokens, h + 2 * kvh, hd).transpose(0, 1)
                q, k, v = qkv[:h], qkv[h : h + kvh], qkv[h + kvh :]
                att = F.scaled_dot_product_attention(
                    q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True, enable_gqa=True
                )
                x = x + blk["o"](att[0].transpose(0, 1).reshape(tokens, h * hd))
                y = F.rms_norm(x, (self.hidden,), self.norm_w)
                gu = blk["gate_up"](y)
                x = x + blk["down"](F.silu(gu[:, :f]) * gu[:, f:])
            return x

        def head(self, x: Any) -> Any:
            return self.lm_head(F.rms_norm(x, (self.hidden,), self.norm_w))

    def graph_ms(fn: Any, x: Any) -> float:
        """Median replay time of `fn(x)` captured in a CUDA graph (as serving stacks run decode)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(x)  # warm-up: kernel selection, workspace allocation
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(x)
        return timed(graph.replay, repeats)

    results: list[dict[str, Any]] = []
    for model, tp, quant, built, batches, context in CASES:
        layers = SHAPES[model][0]
        rank = Rank(model, tp, quant, built, max(batches), context)
        for batch in batches:
            x = torch.randn(batch, rank.hidden, device=dev, dtype=bf16)
            layers_ms, head_ms = graph_ms(rank.layers, x), graph_ms(rank.head, x)
            step_ms = layers_ms * layers / built + head_ms
            results.append({
                "model": model, "tp": tp, "quantization": quant, "batch": batch,
                "context": context, "layers": layers, "layers_built": built,
                "layers_ms": round(layers_ms, 4), "lm_head_ms": round(head_ms, 4),
                "step_ms": round(step_ms, 4),
            })  # fmt: skip
            print(
                f"{model} tp{tp} {quant:5} ctx{context} bs{batch:<4} step {step_ms:8.3f} ms",
                flush=True,
            )
        del rank  # free this case's weights and KV cache before the next
        torch.cuda.empty_cache()

    prefills: list[dict[str, Any]] = []
    for model, tp, quant, built, lengths in PREFILL_CASES:
        layers = SHAPES[model][0]
        rank = Rank(model, tp, quant, built, 1, 1)  # no KV cache to read: the prompt is all
        for tokens in lengths:
            x = torch.randn(tokens, rank.hidden, device=dev, dtype=bf16)
            ms = graph_ms(rank.prefill, x) * layers / built
            prefills.append({
                "model": model, "tp": tp, "quantization": quant, "tokens": tokens,
                "layers": layers, "layers_built": built, "prefill_ms": round(ms, 4),
            })  # fmt: skip
            print(f"{model} tp{tp} {quant:5} prefill {tokens:>5} tokens {ms:8.3f} ms", flush=True)
        del rank
        torch.cuda.empty_cache()

    out.write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hbm_copy_gbs": round(hbm_gbs, 1),
        "repeats": repeats,
        "results": results,
        "prefill": prefills,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {out} (device-to-device copy: {hbm_gbs:.0f} GB/s)")


# ----------------------------------------------------------------------------- compare (model)


def _compare(path: Path) -> None:
    from infertune_tuner.catalog.gpus import GPUS
    from infertune_tuner.catalog.llms import get_model
    from infertune_tuner.config import TrialConfig
    from infertune_tuner.perfmodel.factors import Efficiency, default_efficiency
    from infertune_tuner.perfmodel.latency import StepModel

    data = json.loads(path.read_text())
    gpu = next((g for g in GPUS.values() if g.name == data["gpu"]), None)
    if gpu is None:
        sys.exit(f"error: {data['gpu']!r} is not in the GPU catalog")
    fitted = default_efficiency(gpu.architecture)
    no_host = {"step_overhead_ms": 0.0, "per_seq_overhead_us": 0.0,
               "context_step_overhead_ms": 0.0, "host_overlap": 0.0}  # fmt: skip
    gpu_part = replace(fitted, **no_host)
    roofline = Efficiency(weight_bw=1, kv_bw=1, gemm=1, prefill=1, link=1,
                          allreduce_latency_us=0, **no_host)  # fmt: skip
    print(f"{data['gpu']}, torch {data['torch']}, CUDA {data['cuda']}; device-to-device copy "
          f"{data['hbm_copy_gbs']:.0f} GB/s = {data['hbm_copy_gbs'] / gpu.hbm_bandwidth_gbs:.0%} "
          f"of the datasheet's {gpu.hbm_bandwidth_gbs:.0f} GB/s")  # fmt: skip
    print("one decode step (GPU work only: no host overhead, no all-reduce), ms")
    header = (f"{'model':12} {'tp':>2} {'quant':5} {'ctx':>5} {'batch':>5} {'measured':>9} "
              f"{'roofline':>9} {'fitted':>9} {'meas/roof':>9} {'meas/fit':>9}")  # fmt: skip
    print(header)
    print("-" * len(header))
    rows = data["results"]
    for r in rows:
        model = get_model(r["model"])
        cfg = TrialConfig(r["tp"], r["batch"], r["quantization"], "auto")

        def gpu_ms(
            eff: Efficiency, r: dict[str, Any] = r, cfg: TrialConfig = cfg, model: Any = model
        ) -> float:
            steps = StepModel(model, gpu, cfg, eff)
            return steps.decode_ms(r["batch"], r["context"]) - steps.comm_ms(r["batch"])

        roof, fit = gpu_ms(roofline), gpu_ms(gpu_part)
        r["roofline_ms"], r["fitted_ms"] = roof, fit
        print(f"{r['model']:12} {r['tp']:>2} {r['quantization']:5} {r['context']:>5} {r['batch']:>5} "
              f"{r['step_ms']:>8.3f}  {roof:>8.3f}  {fit:>8.3f}  {r['step_ms'] / roof:>8.2f}  "
              f"{r['step_ms'] / fit:>8.2f}")  # fmt: skip
    print("\nFP8 / bf16 step time by batch (the model's FP8 gain vs the GPU's)")
    print(f"{'model':12} {'batch':>5} {'measured':>9} {'fitted':>9}")
    by_key = {(r["model"], r["tp"], r["quantization"], r["context"], r["batch"]): r for r in rows}
    for (m, tp, q, ctx, b), r in by_key.items():
        if q != "fp8" or (m, tp, "bf16", ctx, b) not in by_key:
            continue
        base = by_key[(m, tp, "bf16", ctx, b)]
        print(f"{m:12} {b:>5} {r['step_ms'] / base['step_ms']:>9.2f} "
              f"{r['fitted_ms'] / base['fitted_ms']:>9.2f}")  # fmt: skip
    if data.get("prefill"):
        _compare_prefill(data["prefill"], gpu, gpu_part, roofline)


def _compare_prefill(rows: list[dict[str, Any]], gpu: Any, fitted: Any, roofline: Any) -> None:
    from infertune_tuner.catalog.llms import get_model
    from infertune_tuner.config import TrialConfig
    from infertune_tuner.perfmodel.latency import StepModel

    print("\nprefill of one prompt (GPU work only: no all-reduce), ms")
    header = (f"{'model':12} {'tp':>2} {'quant':5} {'tokens':>6} {'measured':>9} "
              f"{'roofline':>9} {'fitted':>9} {'meas/roof':>9} {'meas/fit':>9}")  # fmt: skip
    print(header)
    print("-" * len(header))
    no_comm = {"link": 1e9, "allreduce_latency_us": 0.0}  # one rank alone: no all-reduce
    for r in rows:
        cfg = TrialConfig(r["tp"], 1, r["quantization"], "auto")
        model = get_model(r["model"])
        roof, fit = (
            StepModel(model, gpu, cfg, replace(eff, **no_comm)).prefill_ms(r["tokens"])
            for eff in (roofline, fitted)
        )
        meas = r["prefill_ms"]
        print(f"{r['model']:12} {r['tp']:>2} {r['quantization']:5} {r['tokens']:>6} "
              f"{meas:>8.2f}  {roof:>8.2f}  {fit:>8.2f}  {meas / roof:>8.2f}  "
              f"{meas / fit:>8.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser(
        "measure", help="time decode steps and prefills on this machine's GPU (PyTorch)"
    )
    m.add_argument("--out", type=Path, default=Path("decode-step.json"))
    m.add_argument("--repeats", type=int, default=30)
    c = sub.add_parser("compare", help="compare measured steps with the performance model")
    c.add_argument("file", type=Path)
    args = ap.parse_args()
    if args.cmd == "measure":
        _measure(args.out, args.repeats)
    else:
        _compare(args.file)


if __name__ == "__main__":
    main()
