"""Weights from the Hugging Face Hub: only what the runtime loads is downloaded, into the folder
model.yaml names, before the server starts (runtime/weights.fetch_argv).

The real `huggingface_hub` client (the one TensorRT-LLM downloads with) talks to a stand-in Hub
(fake_hub.py). Upstream's own download takes the whole repository but `original/**`
(NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/utils.py, download_hf_model, L221-230:
`ignore_patterns = ["original/**/*"]`), so a repository that ships .bin and .safetensors copies
of its weights, as meta-llama/Llama-2-70b-chat-hf does, needed twice the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infertune_tuner.backends.triton import TritonBackend
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.simulated import SimulatedRuntime
from infertune_tuner.runtime.weights import checkpoint_kv_dtype, fetch_argv

from .fake_hub import FakeHub, serve

MB = 1 << 20
# The layout of meta-llama/Llama-2-70b-chat-hf (scaled down): weights as both .bin and
# .safetensors, plus a Mistral-style consolidated copy and Llama 3's original/ folder.
LLAMA: dict[str, bytes] = {
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b"{}",
    "model.safetensors.index.json": b"{}",
    "model-00001-of-00002.safetensors": b"s" * MB,
    "model-00002-of-00002.safetensors": b"s" * MB,
    "pytorch_model.bin.index.json": b"{}",
    "pytorch_model-00001-of-00002.bin": b"b" * MB,
    "pytorch_model-00002-of-00002.bin": b"b" * MB,
    "consolidated.safetensors": b"c" * 2 * MB,
    "original/consolidated.00.pth": b"p" * 2 * MB,
    "original/params.json": b"{}",
    "tokenizer.model": b"t",
    "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}",
    "special_tokens_map.json": b"{}",
    "README.md": b"# card",
    "LICENSE.txt": b"licence",
    "Responsible-Use-Guide.pdf": b"pdf",
}
BIN_ONLY = {"config.json": b"{}", "pytorch_model.bin": b"b" * MB, "tokenizer.json": b"{}"}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with serve(FakeHub({"org/llama": LLAMA, "org/old": BIN_ONLY, "meta-llama/gated": LLAMA},
                       gated={"meta-llama/gated"})) as h:  # fmt: skip
        yield h


def hub_env(hub: FakeHub, home: Path) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5"}  # fmt: skip


def fetch(hub: FakeHub, repo: str, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fetch_argv(repo, str(dest), python=sys.executable), capture_output=True, text=True,
        env=hub_env(hub, dest.parent / "hf-home"), timeout=120,
    )  # fmt: skip


def test_only_what_the_runtime_loads_is_downloaded(hub: FakeHub, tmp_path: Path) -> None:
    dest = tmp_path / "weights" / "org" / "llama"
    done = fetch(hub, "org/llama", dest)
    assert done.returncode == 0, done.stderr
    assert sorted(hub.downloaded("org/llama")) == sorted([
        "config.json", "generation_config.json", "model.safetensors.index.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "pytorch_model.bin.index.json", "tokenizer.model", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json",
    ])  # fmt: skip
    # One copy of the weights on disk, not the .bin copy, consolidated or original/ as well.
    on_disk = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    assert 2 * MB <= on_disk < 2.1 * MB
    assert (dest / "config.json").is_file() and not (dest / "original").exists()
    # Again: nothing is fetched twice.
    before = len(hub.downloaded("org/llama"))
    assert fetch(hub, "org/llama", dest).returncode == 0
    assert len(hub.downloaded("org/llama")) == before


def test_a_repository_without_safetensors_weights_is_a_clear_failure(
    hub: FakeHub, tmp_path: Path
) -> None:
    done = fetch(hub, "org/old", tmp_path / "old")
    assert done.returncode != 0
    assert "org/old has no *.safetensors weights" in done.stderr
    assert "pytorch_model.bin" not in hub.downloaded("org/old")


@dataclass(frozen=True)
class FetchingSimulatedRuntime(SimulatedRuntime):
    """The simulated server, whose configurations load weights from the (stand-in) Hub into
    `folder` as a Triton runtime's do: the trial machinery's download path, without a GPU."""

    folder: str = ""
    repo: str = "org/llama"

    def fetch(self, request: TuningRequest, config: TrialConfig) -> tuple[str, str] | None:
        return self.repo, f"{self.folder}/{self.repo}"


def trial_backend(
    tmp_path: Path, request: TuningRequest, runtime: Any, phases: list[str]
) -> TritonBackend:
    return TritonBackend(
        request, runtime=runtime, workdir=tmp_path / "trials", requests_per_trial=8, warmup=0,
        startup_timeout_s=30, on_phase=lambda _c, p: phases.append(p),
    )  # fmt: skip


@pytest.fixture
def fetching(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trial_request: Any
) -> Callable[[str], tuple[TritonBackend, list[str]]]:
    """A trial backend on the simulated server whose weights come from the stand-in Hub, and
    the phases it reports."""
    for k, v in hub_env(hub, tmp_path / "hf-home").items():
        monkeypatch.setenv(k, v)

    def make(repo: str) -> tuple[TritonBackend, list[str]]:
        runtime = FetchingSimulatedRuntime(
            program=(sys.executable, "-m", "infertune_tuner.cli.simserver"), time_scale=0.05,
            folder=str(tmp_path / "weights"), repo=repo,
        )  # fmt: skip
        phases: list[str] = []
        return trial_backend(tmp_path, trial_request(), runtime, phases), phases

    return make


def test_a_trial_downloads_before_its_server_starts_and_only_once(
    hub: FakeHub, tmp_path: Path, fetching: Any
) -> None:
    b, phases = fetching("org/llama")
    first = b.run(TrialConfig(1, 4, "bf16", "auto"))
    second = b.run(TrialConfig(1, 8, "bf16", "auto"))
    assert (first.status, second.status) == ("ok", "ok"), (first.reason, second.reason)
    assert phases.index("downloading weights") < phases.index("starting server")
    assert phases.count("downloading weights") == 1
    assert hub.downloaded("org/llama").count("model-00001-of-00002.safetensors") == 1
    assert (tmp_path / "weights" / "org" / "llama" / "config.json").is_file()


def test_a_refused_download_fails_the_trial_with_the_hubs_reason(fetching: Any) -> None:
    b, phases = fetching("meta-llama/gated")
    m = b.run(TrialConfig(1, 4, "bf16", "auto"))
    assert m.status == "error" and m.reason is not None
    assert m.reason.startswith("cannot download meta-llama/gated:")
    assert "starting server" not in phases  # no server for weights that are not there


def test_a_hub_checkpoints_kv_cache_declaration_is_read_without_downloading_it(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ModelOpt checkpoint's hf_quant_config.json may declare an FP8 KV cache; the search
    space is built from it (one small file, a bounded wait: weights.HUB_TIMEOUT_S)."""
    hub.repos["nvidia/model-fp8"] = {
        "hf_quant_config.json": b'{"quantization": {"quant_algo": "FP8", '
        b'"kv_cache_quant_algo": "FP8"}}'
    }
    for k, v in hub_env(hub, Path("/nonexistent")).items():
        monkeypatch.setenv(k, v)
    assert checkpoint_kv_dtype("nvidia/model-fp8") == "fp8"
    assert checkpoint_kv_dtype("org/llama") is None  # no such file: declares nothing
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert checkpoint_kv_dtype("nvidia/model-fp8") is None  # offline: unknown, at once
    assert ("GET", "/nvidia/model-fp8/resolve/main/hf_quant_config.json") in hub.requests
