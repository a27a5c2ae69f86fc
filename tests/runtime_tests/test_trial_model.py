"""A trial's LLM-API model generates exactly the requested tokens; the serving pod's is stock.

The image's model (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/) reads
its sampling parameters with `helpers.get_sampling_params_from_request` (helpers.py L66-96: a
kwargs dict of best_of ... return_perf_metrics, plus `stop`; no ignore_eos, no min_tokens),
imported by name in model.py (L43-47 `from helpers import (... get_sampling_params_from_request
...)`, called at L625) and passed on as `SamplingParams(**sampling_params)` (L507-511). The
stand-ins below have exactly that shape; infertune's wrapper (runtime/llmapi_trial_model.py)
must make every request ignore EOS and generate max_tokens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import Ports
from infertune_tuner.runtime.triton import TRIAL_UPSTREAM_MODEL, TritonRuntime

HELPERS = """\
def get_sampling_params_from_request(request, batch_size=1, batch_index=0):
    kwargs = {"max_tokens": request["sampling_param_max_tokens"], "temperature": 0.0}
    kwargs["stop"] = None
    return kwargs
"""
UPSTREAM_MODEL = """\
from helpers import (get_sampling_params_from_request,)


class SamplingParams:  # tensorrt_llm.SamplingParams: keyword-only, unknown keywords rejected
    def __init__(self, *, max_tokens=32, temperature=None, stop=None, ignore_eos=False,
                 min_tokens=None):
        self.max_tokens, self.ignore_eos, self.min_tokens = max_tokens, ignore_eos, min_tokens


class TritonPythonModel:
    def convert(self, request):
        sampling_params = get_sampling_params_from_request(request)
        return SamplingParams(**sampling_params)
"""


def image(tmp_path: Path) -> Path:
    folder = tmp_path / "app" / "llmapi" / "1"
    folder.mkdir(parents=True)
    (folder / "helpers.py").write_text(HELPERS)
    (folder / "model.py").write_text(UPSTREAM_MODEL)
    return folder


def test_a_trials_requests_ignore_eos_and_generate_max_tokens(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    TritonRuntime(llmapi_model_dir=str(image(tmp_path))).assemble(repo)
    version = repo / "llm" / "1"
    assert sorted(p.name for p in version.iterdir()) == [
        "helpers.py", TRIAL_UPSTREAM_MODEL, "model.py"
    ]  # fmt: skip
    # Triton's Python backend puts the model's folder on sys.path and loads model.py.
    probe = (
        f"import sys; sys.path.insert(0, {str(version)!r}); import model; "
        "p = model.TritonPythonModel().convert({'sampling_param_max_tokens': 64}); "
        "print(p.max_tokens, p.ignore_eos, p.min_tokens)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64", "True", "64"]


def test_the_serving_pod_runs_the_images_model_unchanged() -> None:
    request = TuningRequest.model_validate({
        "name": "t", "model": {"name": "llama-3-8b", "uri": "pvc://m/llama"},
        "gpu": {"product": "H100-SXM-80GB"}, "workload": {"input_tokens": 64, "output_tokens": 8},
        "slo": [{"metric": "itl_ms", "percentile": "p50", "max_ms": 100}],
    })  # fmt: skip
    shape = TritonRuntime().pod(request, TrialConfig(1, 8, "bf16", "auto"), Ports())
    script = shape.command[-1]
    assert "cp /app/all_models/llmapi/tensorrt_llm/1/*.py" in script
    assert TRIAL_UPSTREAM_MODEL not in script
