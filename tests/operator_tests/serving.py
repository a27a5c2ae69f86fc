"""Playing the kubelet for serving pods and the Jobs that talk to them.

A serving pod is the serving Deployment's own command (`infertune simserver ...`) run as a
process on free local ports, a Pod object in the emulator with the Deployment's labels, and the
API server's pod proxy to its metrics port (``pod_proxy``). A verification Job is its own
command (`infertune verify-job ...`) with the Service's address replaced by the pod's. Load is
`infertune bench` against the pod, in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from infertune_tuner.harness.runner import free_ports

from .apiserver import (
    NS,
    FakeApiServer,
    finish_job,
    get,
    jobs_of,
    make_available,
    phase,
    post,
    run_tuner,
    wait_for,
)

METRICS_PORT = 8002
INFERTUNE = str(Path(sys.executable).with_name("infertune"))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.returncode is None:
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@dataclass
class ServingPod:
    name: str
    grpc: int
    metrics: int
    proc: asyncio.subprocess.Process

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    async def stop(self) -> None:
        await _stop(self.proc)


def _set(argv: list[str], flag: str, value: str) -> None:
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]


async def start_serving_pod(
    api: FakeApiServer, name: str, *, time_scale: float = 1.0
) -> ServingPod:
    """Run the serving Deployment's command as a pod of it (at ``time_scale``: above 1, a
    slower node than the tuning measured)."""
    deployment = get(api, "deployments", name)
    assert deployment is not None, f"Deployment {name} missing"
    template = deployment["spec"]["template"]
    argv = list(template["spec"]["containers"][0]["command"])
    assert argv[:2] == ["infertune", "simserver"], argv
    grpc, http, metrics = free_ports(3)
    argv[0] = INFERTUNE
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(grpc)),
                        ("--http-port", str(http)), ("--metrics-port", str(metrics))):  # fmt: skip
        _set(argv, flag, value)
    if time_scale != 1.0:
        _set(argv, "--time-scale", f"{time_scale:g}")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    pod_name = f"{name}-6b7c9d8f5d-{uuid.uuid4().hex[:5]}"
    pod = ServingPod(pod_name, grpc, metrics, proc)
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{metrics}/metrics") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.05)
        else:
            await pod.stop()
            raise AssertionError(f"serving pod {pod_name} did not start: {argv}")
    await post(api, "pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": NS,
                     "labels": dict(template["metadata"]["labels"])},
        "spec": {"containers": [{"name": "simserver", "image": "infertune/operator:test"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    })  # fmt: skip
    api.proxies = {**getattr(api, "proxies", {}), (NS, pod_name, METRICS_PORT):
                   f"http://127.0.0.1:{metrics}"}  # fmt: skip
    return pod


async def remove_serving_pod(api: FakeApiServer, pod: ServingPod) -> None:
    """The pod goes (a rollout replaced it)."""
    await pod.stop()
    async with api.delete(f"/api/v1/namespaces/{NS}/pods/{pod.name}") as resp:
        assert resp.status == 200, await resp.text()
    api.proxies.pop((NS, pod.name, METRICS_PORT), None)


async def run_verifier(job: dict[str, Any], pod: ServingPod) -> str:
    """Play the kubelet for a verification Job: its own command, against the serving pod
    (needs the ``kubeconfig`` fixture: it writes its result through the emulator)."""
    argv = list(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert argv[:2] == ["infertune", "verify-job"], argv
    argv[0] = INFERTUNE
    argv[argv.index("--url") + 1] = pod.url
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, out.decode()
    return out.decode()


@dataclass
class Load:
    """`infertune bench` against a pod, in the background, until stopped."""

    proc: asyncio.subprocess.Process

    async def stop(self) -> None:
        await _stop(self.proc)


async def start_load(
    pod: ServingPod, *, input_tokens: int, output_tokens: int, concurrency: int = 8
) -> Load:
    argv = [INFERTUNE, "bench", "--url", pod.url, "--model", "llm",
            "--concurrency", str(concurrency), "--requests", "100000", "--warmup", "0",
            "--input-tokens", str(input_tokens), "--output-tokens", str(output_tokens),
            "--deadline", "600"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return Load(proc)


async def to_ready(api: FakeApiServer, name: str, tmp_path: Path) -> dict[str, Any]:
    """create -> tuner Job -> the tuner runs -> Job Complete -> available -> Ready."""
    jobs = await wait_for(lambda: jobs_of(api, name), what=f"the tuner Job of {name}")
    job: dict[str, Any] = jobs[0]
    await run_tuner(api, job, tmp_path)
    await finish_job(api, job["metadata"]["name"])
    await wait_for(lambda: get(api, "deployments", name), what="the serving Deployment")
    await wait_for(lambda: phase(api, name) == "Deploying", what="phase Deploying")
    await make_available(api, name, 1)
    await wait_for(lambda: phase(api, name) == "Ready", what="phase Ready")
    return job
