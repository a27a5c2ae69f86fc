"""How fast does the operator start tuning when many InferenceDeployments arrive?

The real operator runs in this process (Kopf in a background thread, the same entry point as
`infertune operator`). The kmock API emulator of the operator tests runs in a child process,
together with the load driver, so that the emulator's CPU is not charged to the operator (they
would share one GIL otherwise). The driver creates N InferenceDeployments, all at once or at a
fixed rate; the emulator notes when each tuner Job's create request arrives. Printed: p50/p95/max
of create -> Job created, when the last status was written (the operator writes statuses after
the Jobs), the CPU both sides spent until then, and the operator process's peak memory.
Goal: p95 < 1 s for a burst of 200.

    python benchmarks/operator_scale.py [--count 200] [--rate R]

Without --rate it runs twice: one burst (all creates at once: worst case), then 50 creates/s
(`kubectl apply` of a folder of manifests). --rate 0 is the burst alone.

The burst starts once the operator's watch streams are open (Kopf raises its ready flag before
it starts watching): it measures an operator that is running, as in a cluster.

Caveat: the emulator runs no admission or etcd; a real API server adds a few milliseconds per
request (6 requests per object end to end, 4 of them up to the Job: the create, the report
ConfigMap read, the request ConfigMap and the Job creates; then the status patch and the event).
The emulator and the operator share this machine's CPUs: a busy machine slows both.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WATCHED = {"inferencedeployments", "jobs", "deployments", "configmaps"}  # Kopf's watch streams


def _helpers() -> ModuleType:
    """The operator tests' emulator helpers (FakeApiServer, manifest, OperatorRunner...),
    imported as the package the tests import (it has modules of its own)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module("operator_tests.apiserver")


# ------------------------------------------------------------------ child: emulator + driver


def _selector(text: str) -> list[tuple[str, str | None]]:
    """`a,b=c` -> [("a", None), ("b", "c")]: label existence and equality (what we use)."""
    out: list[tuple[str, str | None]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.partition("=")
        out.append((key, value if sep else None))
    return out


def _matches(event: dict[str, Any], wanted: list[tuple[str, str | None]]) -> bool:
    labels = (event.get("object") or {}).get("metadata", {}).get("labels") or {}
    return all(k in labels and (v is None or labels[k] == v) for k, v in wanted)


async def emulate(count: int, rate: float, concurrency: int, timeout: float) -> None:
    import kmock

    helpers = _helpers()

    class TimedApiServer(helpers.FakeApiServer):  # type: ignore[name-defined]
        """Notes when each tuner Job's create request arrives; keeps no request history.

        kmock matches every request against its whole request history (quadratic: at ~3,000
        requests it spends seconds per request); the benchmark never reads it, so drop it.
        And it honours a watch's labelSelector, as a real API server does (kmock streams every
        object of the resource): the operator watches only the ConfigMaps that are reports.
        """

        watches_end_in_outages = False  # no faults here: stream events as a plain server does
        job_created: dict[str, float] = {}
        status_written: set[str] = set()
        watched: set[str] = set()

        async def _handle(self, request: Any) -> Any:
            del self._requests[:-1]
            if request.action == kmock.action.WATCH and request.resource is not None:
                self.watched.add(request.resource.plural)
            if (
                request.action == kmock.action.CREATE
                and request.resource is not None
                and request.resource.plural == "jobs"
                and isinstance(request.data, dict)
            ):
                labels = request.data.get("metadata", {}).get("labels") or {}
                owner = labels.get("infertune.io/deployment")
                if owner:
                    self.job_created.setdefault(owner, time.monotonic())
            if request.action == kmock.action.UPDATE and request.subresource == "status":
                self.status_written.add(str(request.name))
            return await super()._handle(request)

        async def _serve_watch(self, request: Any) -> Any:
            wanted = _selector(request.params.get("labelSelector", ""))
            async for event in super()._serve_watch(request):
                if not wanted or not isinstance(event, dict) or _matches(event, wanted):
                    yield event

    async with TimedApiServer() as api, kmock.Server(api):
        helpers.declare_resources(api)
        print(helpers.api_url(api), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the operator is ready
        # Kopf raises its ready flag before its watch streams start: the creates are meant to
        # meet an operator that is already watching (as in a cluster), not its initial listing.
        deadline = time.monotonic() + 10
        while not api.watched >= WATCHED and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the watch requests have arrived; let their streams settle

        created: dict[str, float] = {}
        gate = asyncio.Semaphore(concurrency)

        async def create_one(i: int) -> None:
            name = f"bench-{i:04d}"
            async with gate:
                created[name] = time.monotonic()
                await helpers.create(api, helpers.manifest(name))

        started, cpu_started = time.monotonic(), time.process_time()
        tasks = []
        for i in range(count):
            tasks.append(asyncio.create_task(create_one(i)))
            if rate > 0:
                await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
        await asyncio.gather(*tasks)
        submitted = time.monotonic() - started
        deadline = time.monotonic() + timeout
        while len(api.job_created) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        last_job = time.monotonic() - started
        # The operator writes statuses after the Jobs (one writer): count that work too.
        while len(api.status_written) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        result = {
            "submitted_s": submitted,
            "total_s": last_job,
            "status_s": time.monotonic() - started,
            "emulator_cpu_s": time.process_time() - cpu_started,
            "latencies": [
                api.job_created[n] - t for n, t in created.items() if n in api.job_created
            ],
        }
        print(json.dumps(result), flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the operator has stopped


# ------------------------------------------------------------------ parent: the operator


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


async def measure(args: argparse.Namespace) -> int:
    helpers = _helpers()
    child = subprocess.Popen(
        [sys.executable, __file__, "--emulator", "--count", str(args.count),
         "--rate", str(args.rate), "--concurrency", str(args.concurrency),
         "--timeout", str(args.timeout)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    try:
        url = (await asyncio.to_thread(child.stdout.readline)).strip()
        rss_before = _rss_mib()
        runner = await helpers.OperatorRunner(url).start()
        try:
            cpu_started = time.process_time()
            child.stdin.write("go\n")
            child.stdin.flush()
            line = await asyncio.to_thread(child.stdout.readline)
            operator_cpu = time.process_time() - cpu_started
        finally:
            await runner.stop()
        rss_peak = _rss_mib()
        child.stdin.write("done\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=30)
    result = json.loads(line)
    latencies: list[float] = result["latencies"]
    missing = args.count - len(latencies)
    mode = "one burst" if args.rate <= 0 else f"{args.rate:g}/s"
    print(f"operator scale: {args.count} InferenceDeployments ({mode}), operator in-process, "
          f"kmock emulator in a child process, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"  creates submitted in {result['submitted_s']:.2f} s; "
          f"last Job created at {result['total_s']:.2f} s, last status written at "
          f"{result['status_s']:.2f} s")  # fmt: skip
    if latencies:
        ms = [v * 1000 for v in latencies]
        print(f"  create -> Job created: p50 {_pct(ms, 50):.0f} ms, p95 {_pct(ms, 95):.0f} ms, "
              f"max {max(ms):.0f} ms, mean {statistics.fmean(ms):.0f} ms")  # fmt: skip
    if missing:
        print(f"  {missing} Job(s) not created within {args.timeout:g} s")
    n = max(1, len(latencies))
    print(f"  CPU until the last status: operator {operator_cpu:.2f} s ({operator_cpu / n * 1000:.1f} ms/object), "
          f"emulator + driver {result['emulator_cpu_s']:.2f} s "
          f"({result['emulator_cpu_s'] / n * 1000:.1f} ms/object)")  # fmt: skip
    print(f"  operator process peak RSS {rss_peak:.0f} MiB "
          f"({rss_peak - rss_before:+.0f} MiB while reconciling)")  # fmt: skip
    p95 = _pct(latencies, 95) if latencies else float("inf")
    print(f"  goal p95 < 1 s: {'met' if p95 < 1.0 and not missing else 'NOT met'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--rate", type=float, default=None, help="creates per second (0: burst)")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent create requests")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--emulator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.emulator:
        asyncio.run(emulate(args.count, args.rate, args.concurrency, args.timeout))
        return 0
    rates = [args.rate] if args.rate is not None else [0.0, 50.0]
    for i, rate in enumerate(rates):
        if i:
            print()
        asyncio.run(measure(argparse.Namespace(**{**vars(args), "rate": rate})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
