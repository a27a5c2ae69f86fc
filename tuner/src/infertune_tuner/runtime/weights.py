"""Which weights a configuration loads, where they sit in the server's filesystem, and what the
checkpoint says about itself (pure, except `checkpoint_kv_dtype`, which reads one small file).

- A 16-bit configuration loads the base model (`spec.model.source.uri`, else the catalog's
  Hugging Face id); every other quantization loads a pre-quantized ModelOpt checkpoint
  (`spec.model.checkpoints.<q>`): TensorRT-LLM's PyTorch backend does not quantize at load time.
- `pvc://claim/path` is mounted read-only at `/models` (path `/models/path`); Hugging Face ids
  download into the model cache at `/model-cache` (`HF_HOME=/model-cache/huggingface`), a
  separate mount so that a deployment may mix both.
- A ModelOpt checkpoint's `hf_quant_config.json` may declare an FP8 KV cache
  (`quantization.kv_cache_quant_algo: FP8`): TensorRT-LLM then runs `kv_cache_config.dtype: auto`
  as FP8 (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/model_config.py,
  `ModelConfig.load_modelopt_quant_config`; `KvCacheConfig.dtype` "auto" follows the checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infertune_tuner.catalog.quantization import QUANTIZATIONS
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest

MODELS_ROOT = "/models"  # a pvc:// claim, read-only
CACHE_ROOT = "/model-cache"  # downloads (HF_HOME)
HF_HOME = f"{CACHE_ROOT}/huggingface"
CACHE_ROOT_ENV = "INFERTUNE_MODEL_CACHE"  # a local tuner's cache, where /model-cache is not
WEIGHTS_DIR = "weights"  # downloaded repositories: <cache>/weights/<org>/<name>
# What the runtime loads from a Hugging Face repository, and all that is downloaded of it.
# TensorRT-LLM's own download fetches the whole repository but `original/**` (NVIDIA/TensorRT-LLM
# tensorrt_llm/llmapi/utils.py, download_hf_model: `ignore_patterns = ["original/**/*"]`), so a
# repository that ships its weights as both .bin and .safetensors (meta-llama/Llama-2-70b-chat-hf)
# or adds Mistral's consolidated.safetensors needs twice the space and the kubelet evicts the
# pod. infertune downloads the safetensors weights, the JSON files (config, generation config,
# tokenizer config, the safetensors index, hf_quant_config.json) and the tokenizer, into a
# folder of its own, and model.yaml names that folder: the LLM API then loads it as a local
# checkpoint and downloads nothing.
DOWNLOAD_ALLOW = (
    "*.safetensors", "*.json", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt",
)  # fmt: skip
DOWNLOAD_IGNORE = ("original/*", "consolidated*")
SIXTEEN_BIT = frozenset({"bf16", "fp16"})
QUANT_CONFIG_FILE = "hf_quant_config.json"
GIB = 1024**3
# Room beside the weights in a download cache: tokenizer, config, partial downloads.
CACHE_HEADROOM = 1.1
CACHE_EXTRA_GIB = 8


class MissingCheckpoint(ValueError):
    """A quantized configuration needs a pre-quantized checkpoint the request does not name."""


def checkpoint_uri(
    quantization: str, checkpoints: Mapping[str, str], base_uri: str | None, fallback: str
) -> str:
    """The weights a configuration loads: the checkpoint for its quantization; the base model for
    16-bit; `fallback` (a Hugging Face id) when no base URI is given."""
    if quantization in checkpoints:
        return checkpoints[quantization]
    if quantization in SIXTEEN_BIT:
        return base_uri or fallback
    raise MissingCheckpoint(
        f"{quantization} needs a pre-quantized (ModelOpt) checkpoint, and none is given: set "
        f"spec.model.checkpoints.{quantization} (TensorRT-LLM's PyTorch backend does not "
        "quantize at load time)"
    )


def default_model_id(name: str, hf_ids: Sequence[str] = ()) -> str:
    """The Hugging Face id to load when no URI is given: the name itself when it is one (has a
    slash), else the catalog entry's first id, else the name."""
    if "/" in name:
        return name.removeprefix("hf://")
    return hf_ids[0] if hf_ids else name


def split_pvc(uri: str) -> tuple[str, str] | None:
    """`pvc://claim/some/path` -> ("claim", "some/path"); None for other schemes."""
    if not uri.startswith("pvc://"):
        return None
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path.strip("/")


# What the runtime can open. TensorRT-LLM's LLM API loads a local directory or, for any other
# string, a Hugging Face id (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/utils.py,
# `download_hf_model`): an `s3://` or `gs://` URI would be sent to the Hub as an id and fail.
# So infertune accepts exactly: pvc:// (mounted), file:// (a path inside the image or a volume),
# hf:// and a bare `org/name` Hugging Face id.
LOADABLE_SCHEMES = ("pvc", "hf", "file")
URI_PATTERN = r"^((pvc|hf|file)://.+|[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+)$"
_HF_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$")


def uri_problem(uri: str) -> str | None:
    """Why the serving runtime cannot load weights from `uri`, or None when it can."""
    scheme, sep, rest = uri.partition("://")
    if sep and scheme in LOADABLE_SCHEMES and rest:
        return None
    if not sep and _HF_ID.match(uri):
        return None
    if sep:
        return (
            f"{scheme}:// is not a source the runtime can load ({uri!r}): TensorRT-LLM loads a "
            "directory or a Hugging Face id. Copy the weights to a volume and use "
            "pvc://claim/path, or use hf://org/name"
        )
    return (
        f"{uri!r} is neither a URI (pvc://claim/path, hf://org/name, file:///path) nor a "
        "Hugging Face id (org/name)"
    )


def model_path_for(uri: str, models_root: str = MODELS_ROOT) -> str:
    """What model.yaml's `model` holds for a URI: a local path or a Hugging Face id.

    pvc://claim/path -> <models_root>/path (the claim is mounted there); hf://org/name ->
    org/name; file:///abs -> /abs; a bare org/name id unchanged. Any other scheme raises
    ValueError (`uri_problem`): the API refuses such sources before anything renders.
    """
    problem = uri_problem(uri)
    if problem is not None:
        raise ValueError(problem)
    pvc = split_pvc(uri)
    if pvc is not None:
        return f"{models_root.rstrip('/')}/{pvc[1]}" if pvc[1] else models_root
    if uri.startswith("hf://"):
        return uri.removeprefix("hf://")
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    return uri


def hub_repo(uri: str) -> str | None:
    """The Hugging Face repository `org/name` that `uri` downloads, or None (pvc://, file://)."""
    if split_pvc(uri) is not None or uri.startswith("file://"):
        return None
    return model_path_for(uri)


def served_path(uri: str, cache_root: str = CACHE_ROOT, models_root: str = MODELS_ROOT) -> str:
    """model.yaml's `model` for weights at `uri`: the mounted or local path, or for a Hugging
    Face repository the folder it is downloaded to (`fetch_argv`) before the server starts."""
    repo = hub_repo(uri)
    if repo is None:
        return model_path_for(uri, models_root)
    return f"{cache_root.rstrip('/')}/{WEIGHTS_DIR}/{repo}"


# Run by the serving pod's init container (the Triton image's python3 has huggingface_hub: the
# LLM API downloads with it) and by the tuner before a trial's server starts: argv 1 = the
# repository, 2 = the folder; HF_TOKEN from the environment.
_FETCH = """import glob, sys
from huggingface_hub import snapshot_download
repo, dest = sys.argv[1], sys.argv[2]
allow, ignore = {allow!r}, {ignore!r}
snapshot_download(repo, local_dir=dest, allow_patterns=list(allow), ignore_patterns=list(ignore))
if not glob.glob(dest + "/*.safetensors"):
    sys.exit(f"{{repo}} has no *.safetensors weights: TensorRT-LLM loads safetensors checkpoints "
             "(convert it, or copy a safetensors checkpoint to a volume and use pvc://)")
print(f"{{repo}}: downloaded to {{dest}}")
"""


def fetch_argv(repo: str, dest: str, python: str = "python3") -> list[str]:
    """The command that downloads what the runtime loads of `repo` into `dest`."""
    script = _FETCH.format(allow=DOWNLOAD_ALLOW, ignore=DOWNLOAD_IGNORE)
    return [python, "-c", script, repo, dest]


def _fallback_id(request: TuningRequest) -> str:
    try:
        hf_ids = request.resolve_model().hf_ids
    except Exception:  # an unknown model with an architecture override has no catalog ids
        hf_ids = ()
    return default_model_id(request.model.name, hf_ids)


def weights_uri(request: TuningRequest, config: TrialConfig) -> str:
    """The URI of the weights `config` loads (raises MissingCheckpoint)."""
    m = request.model
    return checkpoint_uri(config.quantization, m.checkpoints, m.uri, _fallback_id(request))


def base_uri(request: TuningRequest) -> str:
    """The 16-bit base model's URI (what a server loads when no checkpoint applies)."""
    return request.model.uri or _fallback_id(request)


def trial_weights(request: TuningRequest) -> list[str]:
    """Every weights URI a trial of this request may load (the base model and the checkpoint of
    each searched quantization that has one)."""
    uris: list[str] = []
    for q in request.search.quantization:
        try:
            uri = weights_uri(request, TrialConfig(1, 1, q, "auto"))
        except MissingCheckpoint:
            continue
        if uri not in uris:
            uris.append(uri)
    return uris


def unloaded_path(request: TuningRequest, config: TrialConfig) -> str:
    """model.yaml's `model` for a server that loads no weights (the simulated server,
    infertune's own Python-backend model): where `config`'s weights would be served from (the
    base model's when the quantization has no checkpoint), or the model's name when it has no
    weights anywhere (a custom architecture tuned on a simulated pool)."""
    try:
        uri = weights_uri(request, config)
    except MissingCheckpoint:
        uri = base_uri(request)
    return request.model.name if uri_problem(uri) is not None else served_path(uri)


def unloadable(request: TuningRequest) -> str | None:
    """Why the runtime would find no weights for `request`, or None: a model named neither by a
    catalog key with a known Hugging Face id nor by an id itself, with no spec.model.source
    (a custom architecture, say) leaves TensorRT-LLM nothing to load. The base model counts
    even when every searched quantization has a checkpoint: the tuner pod and a 16-bit server
    are shaped for it."""
    for uri in dict.fromkeys([base_uri(request), *trial_weights(request)]):
        if (problem := uri_problem(uri)) is not None:
            return (
                f"no weights to load for {request.model.name!r}: {problem}. Set "
                "spec.model.source.uri (pvc://claim/path, hf://org/name or file:///path), or "
                "tune with spec.tuning.backend: simulated, which loads none"
            )
    return None


def missing_checkpoints(request: TuningRequest, quantizations: Iterable[str]) -> list[str]:
    """The quantizations of `quantizations` that have no weights to load."""
    return [q for q in quantizations if q not in SIXTEEN_BIT and q not in request.model.checkpoints]


def uses_model_cache(uris: Iterable[str]) -> bool:
    """Whether any of these weights is downloaded (not mounted from a PVC)."""
    return any(split_pvc(u) is None for u in uris)


def pvc_claims(uris: Iterable[str]) -> list[str]:
    """The PVCs these weights live on, in order, each once."""
    out: list[str] = []
    for u in uris:
        pvc = split_pvc(u)
        if pvc is not None and pvc[0] not in out:
            out.append(pvc[0])
    return out


def cache_gib(request: TuningRequest, quantizations: Iterable[str]) -> int:
    """A download cache big enough for every downloaded checkpoint of `quantizations` (whole
    GiB): the model's parameters at each format's bytes per weight, plus headroom."""
    try:
        model = request.resolve_model()
    except Exception:
        return CACHE_EXTRA_GIB * 4
    total = 0.0
    seen: set[str] = set()
    for q in quantizations:
        try:
            uri = weights_uri(request, TrialConfig(1, 1, q, "auto"))
        except MissingCheckpoint:
            continue
        if uri in seen or split_pvc(uri) is not None:
            continue
        seen.add(uri)
        spec = QUANTIZATIONS.get(q)
        total += model.params * (spec.weight_bytes if spec else 2.0)
    return math.ceil(total * CACHE_HEADROOM / GIB) + CACHE_EXTRA_GIB


# ---------------------------------------------------------------------- the checkpoint's word


def kv_dtype_from_quant_config(doc: Mapping[str, Any]) -> str | None:
    """ "fp8" when a ModelOpt `hf_quant_config.json` declares an FP8 KV cache, else None.

    The file's shape (ModelOpt's unified Hugging Face export):
    ``{"producer": {...}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}``.
    """
    q = doc.get("quantization")
    if not isinstance(q, Mapping):
        return None
    algo = q.get("kv_cache_quant_algo")
    return "fp8" if isinstance(algo, str) and algo.upper() == "FP8" else None


def _read_local(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# One small JSON file, asked for once while the search space is built: a bounded wait, no
# retries (huggingface_hub's client retries a network error five times with backoff, ~45 s per
# file on a machine that cannot reach the Hub).
HUB_TIMEOUT_S = 10.0


def _read_hub(repo_id: str) -> dict[str, Any] | None:
    """The checkpoint's hf_quant_config.json from the Hugging Face Hub (HF_ENDPOINT, with
    HF_TOKEN for gated repositories); None when offline (HF_HUB_OFFLINE), unreachable within
    HUB_TIMEOUT_S, or when the repository has no such file."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{repo_id}/resolve/main/{QUANT_CONFIG_FILE}"
    headers = {"User-Agent": "infertune"}
    if token := os.environ.get("HF_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=HUB_TIMEOUT_S
        ) as response:
            doc = json.loads(response.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError):  # HTTP errors, timeouts, unreachable, not JSON
        return None
    return doc if isinstance(doc, dict) else None


def checkpoint_kv_dtype(model_path: str) -> str | None:
    """The KV-cache dtype a checkpoint declares ("fp8"), or None when it declares none or the
    file cannot be read here. `model_path` is model.yaml's `model`: a local path (a mounted PVC,
    file://) or a Hugging Face id."""
    local = Path(model_path)
    if local.is_absolute():
        doc = _read_local(local / QUANT_CONFIG_FILE) if local.is_dir() else None
    elif "://" not in model_path and model_path.count("/") == 1:
        doc = _read_hub(model_path)
    else:
        doc = None
    return kv_dtype_from_quant_config(doc) if doc is not None else None
