"""How much memory does a hostile report ConfigMap cost the operator?

Anyone who may write ConfigMaps in a namespace can label one as an InferenceDeployment's report.
This seeds one whose ``report.json.gz`` is a gzip bomb (about 1 MiB that inflates about a
thousand-fold, the most the API server's 1 MiB limit lets through), creates the
InferenceDeployment it claims to answer, runs the real operator in this process against the
Kubernetes API emulator of the operator tests, and waits until the status says what happened.
Printed: the outcome and the process's peak RSS (operator and emulator together). Goal: under
300 MiB (the chart's memory limit is 1 GiB; before the reader was bounded this took 2.1 GiB).

    python benchmarks/report_bomb.py [--packed-mib 1]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import resource
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _tests(module: str) -> ModuleType:
    """A module of the operator tests (the emulator and its helpers), imported as they are."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module(f"operator_tests.{module}")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def measure(packed_mib: float) -> int:
    import kmock

    from infertune_operator.policy.tuning import tuning_hash

    helpers, bomb = _tests("apiserver"), _tests("test_report_bomb")
    packed = bomb.gzip_bomb(int(packed_mib * 1024 * 1024))
    before = _rss_mib()
    async with helpers.FakeApiServer() as api, kmock.Server(api, server_cls=helpers.ApiServerHttp):
        helpers.declare_resources(api)
        body = helpers.manifest("bomb")
        cm = bomb.bomb_configmap("bomb", tuning_hash(body["spec"], helpers.SETTINGS))
        await helpers.post(api, "configmaps", cm)
        runner = await helpers.start_operator(api)
        try:
            started = time.monotonic()
            await helpers.create(api, body)
            await helpers.wait_for(lambda: helpers.phase(api, "bomb") is not None, timeout=120,
                                   what="a status")  # fmt: skip
            took = time.monotonic() - started
            tuned = helpers.condition(helpers.idf(api, "bomb"), "Tuned")
        finally:
            await runner.stop()
    peak = _rss_mib()
    print(f"report bomb: {len(packed) / 2**20:.2f} MiB of gzip in report.json.gz, "
          f"operator and emulator in one process")  # fmt: skip
    print(f"  status after {took:.1f} s: phase {helpers.phase(api, 'bomb')}, "
          f"Tuned={tuned.get('status')} {tuned.get('reason')}")  # fmt: skip
    print(f"  message: {str(tuned.get('message', ''))[:160]}")
    print(f"  process peak RSS {peak:.0f} MiB ({peak - before:+.0f} MiB while reconciling); "
          f"goal < 300 MiB: {'met' if peak < 300 else 'NOT met'}")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--packed-mib", type=float, default=1.0, help="size of the gzip bomb")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory():
        return asyncio.run(measure(args.packed_mib))


if __name__ == "__main__":
    sys.exit(main())
