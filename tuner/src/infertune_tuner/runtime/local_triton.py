"""A real Triton Inference Server on this machine, serving infertune's own Python-backend model.

The `nvidia-pytriton` wheel (the `triton` extra) ships a `tritonserver` binary, its Python
backend and the backend's stub for each Python version. This runtime serves with it the model
repository infertune renders for TensorRT-LLM — the same `config.pbtxt` and `model.yaml` the
serving Deployment gets — with two files of its own in the version folder: `model.py`
(`infertune_tuner/triton_model/model.py`) and `body.json` (which body runs the steps:
`simulated`, the performance model's timings, no GPU; or `torch`, a Llama-shaped PyTorch model on
the local GPU).
Triton itself validates the rendered config, answers health and readiness, streams the decoupled
responses and serves the metrics port; only the model body is ours.

What the wheel needs around it, found by running it (tests/harness_tests/test_local_triton.py
keeps it true):

- the binary is `pytriton/tritonserver/bin/tritonserver`; its libraries are in the wheel's
  `nvidia_pytriton.libs` folder (LD_LIBRARY_PATH);
- the Python backend's folder must hold `libtriton_python.so`, `triton_python_backend_utils.py`
  and the stub of the running Python (`python_backend_stubs/3.X/triton_python_backend_stub`): the
  launch assembles it next to the trial's repository (`--backend-directory`);
- the stub links the system's shared `libpython3.X.so.1.0` (Debian: package `libpython3.X`);
- the stub's interpreter ignores PYTHONPATH: model.py adds the folders INFERTUNE_STUB_PATH names
  (the tuner's site-packages and source folders) itself.

INFERTUNE_TRITONSERVER overrides where the binary is (an unpacked wheel elsewhere).
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import infertune_tuner
import infertune_tuner.triton_model
from infertune_tuner.config import TrialConfig
from infertune_tuner.request import TuningRequest
from infertune_tuner.runtime.base import SERVED_MODEL, PlainServer, Ports
from infertune_tuner.runtime.triton import repository_files
from infertune_tuner.runtime.weights import unloaded_path
from infertune_tuner.triton_model.spec import BODY_FILE, BodyKind, BodySpec

BINARY_ENV = "INFERTUNE_TRITONSERVER"
STUB_PATH_ENV = "INFERTUNE_STUB_PATH"
BACKENDS_DIR = "triton-backends"  # beside the trial's repository
PYTHON_BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB = "triton_python_backend_stub"
# Imported only inside the stub (it needs triton_python_backend_utils): copied, never imported.
MODEL_PY = Path(infertune_tuner.triton_model.__file__).parent / "model.py"


class TritonUnavailable(RuntimeError):
    """The local tritonserver cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's server, libraries, Python backend and stubs are."""

    binary: Path

    @property
    def root(self) -> Path:  # .../pytriton/tritonserver
        return self.binary.parent.parent

    @property
    def libs(self) -> Path:  # .../nvidia_pytriton.libs, beside the pytriton package
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub(self, version: tuple[int, int] = sys.version_info[:2]) -> Path:
        return self.root / "python_backend_stubs" / f"{version[0]}.{version[1]}" / STUB

    @classmethod
    def find(cls) -> TritonInstall:
        """The installed wheel's server (or INFERTUNE_TRITONSERVER's); TritonUnavailable names
        what is missing."""
        override = os.environ.get(BINARY_ENV)
        if override:
            binary = Path(override)
        else:
            spec = importlib.util.find_spec("pytriton")
            if spec is None or not spec.submodule_search_locations:
                raise TritonUnavailable(
                    "no local tritonserver: install the triton extra (pip install -e '.[triton]', "
                    f"the nvidia-pytriton wheel) or set {BINARY_ENV}"
                )
            package = Path(next(iter(spec.submodule_search_locations)))
            binary = package / "tritonserver" / "bin" / "tritonserver"
        install = cls(binary)
        install.check()
        return install

    def check(self) -> None:
        """TritonUnavailable unless the binary, the Python backend, the running Python's stub
        and the shared libpython it links are all there."""
        version = "{}.{}".format(*sys.version_info[:2])
        missing = [
            str(p)
            for p in (
                self.binary,
                *(self.root / "backends" / "python" / f for f in PYTHON_BACKEND_FILES),
                self.stub(),
            )
            if not p.is_file()
        ]
        if missing:
            raise TritonUnavailable(
                f"the local tritonserver is incomplete: no {', '.join(missing)}"
            )
        if ctypes.util.find_library(f"python{version}") is None:
            raise TritonUnavailable(
                f"Triton's Python-backend stub links the system's shared libpython{version}, which "
                f"is not installed (Debian/Ubuntu: apt-get install libpython{version})"
            )

    def assemble_backends(self, into: Path) -> Path:
        """`into`/python with the Python backend and this Python's stub (hard links when the
        file system allows, else copies); returns `into` for --backend-directory."""
        python = into / "python"
        python.mkdir(parents=True, exist_ok=True)
        sources = [self.root / "backends" / "python" / f for f in PYTHON_BACKEND_FILES]
        for source in [*sources, self.stub()]:
            target = python / source.name
            if target.exists():
                continue
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
        return into


def stub_path() -> str:
    """The folders the stub's interpreter must add, in this Python's import order: PYTHONPATH,
    its site-packages, the folder infertune is imported from; never its standard library (the
    stub brings the system's, and the two must not mix)."""
    stdlib = [Path(sysconfig.get_path(k)).resolve() for k in ("stdlib", "platstdlib")]

    def in_stdlib(folder: Path) -> bool:
        return any(folder == s or s in folder.parents for s in stdlib)

    folders = [p for p in sys.path if p and not in_stdlib(Path(p).resolve())]
    folders += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    folders.append(str(Path(infertune_tuner.__file__).resolve().parent.parent))
    return os.pathsep.join(dict.fromkeys(f for f in folders if Path(f).is_dir()))


@dataclass(frozen=True)
class LocalTritonRuntime(PlainServer):
    """The wheel's tritonserver with infertune's model (see the module docstring).

    `body`: `simulated` (the performance model's step times x `time_scale`) or `torch` (real
    GPU steps; `time_scale` must stay 1)."""

    body: BodyKind = "simulated"
    time_scale: float = 1.0
    binary: Path | None = None  # None: TritonInstall.find()

    @property
    def name(self) -> str:
        return f"triton:{self.body}"

    def install(self) -> TritonInstall:
        if self.binary is None:
            return TritonInstall.find()
        install = TritonInstall(self.binary)
        install.check()
        return install

    def problems(self, request: TuningRequest) -> list[str]:
        """What the wheel's tritonserver lacks here (TritonInstall.check names it)."""
        try:
            self.install()
        except TritonUnavailable as exc:
            return [str(exc)]
        return []

    def model_files(self, request: TuningRequest, config: TrialConfig) -> dict[str, str]:
        """Triton's files (a quantization without a checkpoint points at the base model: no
        weights are loaded) and body.json."""
        files = repository_files(request, config, unloaded_path(request, config))
        spec = BodySpec.of(
            self.body, request.resolve_model(), request.resolve_gpu().key, config,
            request.workload.input_tokens + request.workload.output_tokens, self.time_scale,
        )  # fmt: skip
        files[f"{SERVED_MODEL}/1/{BODY_FILE}"] = spec.text()
        return files

    def assemble(self, repo_dir: Path) -> None:
        version = repo_dir / SERVED_MODEL / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copy2(MODEL_PY, version / "model.py")
        self.install().assemble_backends(repo_dir.parent / BACKENDS_DIR)

    def launch_argv(
        self, request: TuningRequest, config: TrialConfig, *, repo_dir: str, ports: Ports,
        host: str = "0.0.0.0",
    ) -> list[str]:  # fmt: skip
        install = self.install()
        libs = os.pathsep.join(
            p for p in (str(install.libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        return [
            "env", f"LD_LIBRARY_PATH={libs}", f"{STUB_PATH_ENV}={stub_path()}",
            str(install.binary), f"--model-repository={repo_dir}",
            f"--backend-directory={Path(repo_dir).parent / BACKENDS_DIR}",
            f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
            f"--metrics-port={ports.metrics}", f"--http-address={host}",
            f"--grpc-address={host}", "--disable-auto-complete-config", "--log-verbose=0",
        ]  # fmt: skip
