"""Helpers: the operator against kmock: a stateful Kubernetes API emulator on a local port.

``FakeApiServer`` adds the bits of a real API server the operator's flow leans on and kmock
leaves out: uid / resourceVersion / generation / creationTimestamp on writes, names for
``generateName``, the status subresource split (a ``/status`` patch changes only status,
a main-resource patch never does), server-side apply with field ownership and the validation of
resource quantities (``apply_emulation``). No controllers run: tests play the Job controller and the
Deployment controller by patching status (and play the tuner by running `infertune tune-job`).

The operator runs for real (``kopf.operator``) in a background thread with its own event loop;
Kopf logs in through a custom login handler, the operator's client through ``Kube.for_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import attrs
import jsonpatch
import kmock
import kopf
from kmock._internal import enums
from kmock._internal.dicts import patch_dict
from kmock._internal.k8s import KubernetesError

from infertune_operator.kube.client import Kube
from infertune_operator.policy.backoff import Backoff
from infertune_operator.settings import Settings
from infertune_tuner.result import Report

from . import apply_emulation as emulation
from . import faults, pod_proxy

NS = "team-a"
IDF_PATH = "infertune.io/v1alpha1/inferencedeployments"
# How often an open watch stream checks whether an outage of GET began (real seconds): a tenth
# of a second is 2 emulated seconds at the tests' usual TIME_SCALE of 0.05, well under any
# backoff step the tests measure.
WATCH_OUTAGE_POLL_S = 0.1

RESOURCES: dict[str, dict[str, Any]] = {
    IDF_PATH: {"kind": "InferenceDeployment", "subresources": {"status"}},
    "batch/v1/jobs": {"kind": "Job", "subresources": {"status"}},
    "apps/v1/deployments": {"kind": "Deployment", "subresources": {"status"}},
    "v1/configmaps": {"kind": "ConfigMap"},
    "v1/services": {"kind": "Service", "subresources": {"status"}},
    "v1/pods": {"kind": "Pod", "subresources": {"status", "log"}},
    "v1/serviceaccounts": {"kind": "ServiceAccount"},
    "rbac.authorization.k8s.io/v1/rolebindings": {"kind": "RoleBinding"},
    "v1/events": {"kind": "Event"},
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "namespaced": False,
    },
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}

SETTINGS = Settings(
    operator_image="infertune/operator:test",
    tuner_image="infertune/tuner:test",
    default_backend="triton",
    job_backoff_limit=2,
)


class FakeApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus server-assigned metadata and the status subresource split, PUT and
    optimistic concurrency, the ConfigMap size limit, and injected outages (see ``faults``)."""

    _rv = itertools.count(1000)
    outages: list[faults.Outage]
    # The API server's pod proxy (pods/<pod>:<port>/proxy/...): (namespace, pod, port) -> the
    # local URL of what that pod serves there (serving.py registers a serving pod's metrics).
    proxies: dict[tuple[str, str, int], str]

    async def _handle(self, request: Any) -> Any:
        if "/proxy/" in request.url.path:
            return await pod_proxy.forward(getattr(self, "proxies", {}), request.url.path)
        for outage in getattr(self, "outages", []):
            plural = request.resource.plural if request.resource is not None else None
            name = request.name or _created_name(request.data)
            if outage.active() and outage.matches(request.method.value, plural,
                                                  request.subresource, name):  # fmt: skip
                raise outage.fail(request.method.value, str(plural), name)
        if request.resource is not None and request.name is not None:
            live = self._live(request)
            if request.method.value == "PUT" and request.subresource is None:
                self._emulate_put(request, live)
            elif request.action == enums.action.DELETE:
                faults.check_delete_preconditions(request.resource.plural, live, request.data)
            elif request.action == enums.action.UPDATE and request.subresource is None:
                faults.check_resource_version(request.resource.plural, live, request.data)
        if request.resource is not None and request.subresource is None:
            self._emulate_write(request)
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            if request.action == enums.action.CREATE:
                self._on_create(data)
            elif request.action == enums.action.UPDATE:
                self._on_update(request, data)
        elif request.action == enums.action.UPDATE and isinstance(data, list):  # JSON patch
            data.append({"op": "replace", "path": "/metadata/resourceVersion",
                         "value": str(next(self._rv))})  # fmt: skip
        return await super()._handle(request)

    # False where no outage is ever injected (benchmarks/operator_scale.py): each event then
    # costs no check for one.
    watches_end_in_outages = True

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        """kmock's watch stream, ended when an outage (5xx) of GET on the resource starts: a real
        API server that fails its reads drops its watch connections too, and the client
        reconnects into the outage (kmock's own stream would go on serving events through it).
        A throttle (429) leaves open streams alone, as API Priority and Fairness does: it
        limits new requests only."""
        if not self.watches_end_in_outages:
            async for event in super()._serve_watch(request):
                yield event
            return
        plural = request.resource.plural if request.resource is not None else None
        events = aiter(super()._serve_watch(request))
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait({pending}, timeout=WATCH_OUTAGE_POLL_S)
                if pending in done:
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    yield event
                elif any(o.status >= 500 and o.active() and o.matches("GET", plural, None)
                         for o in getattr(self, "outages", [])):  # fmt: skip
                    return
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
            await events.aclose()  # type: ignore[attr-defined]

    async def _render_error(self, exc: Exception) -> Any:
        # A failed JSON-patch "test" (Kopf's optimistic concurrency) is 422 on a real server.
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = KubernetesError(status=422, reason="Invalid", message=str(exc))
        if isinstance(exc, KubernetesError) and not exc.details:
            # kmock would attach a formatted traceback (slow: it stats every cached source file).
            exc = attrs.evolve(exc, details={"causes": []})
        response = await super()._render_error(exc)
        if isinstance(exc, faults.RetryAfterError) and exc.retry_after is not None:
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    def _live(self, request: Any) -> dict[str, Any] | None:
        try:
            obj = self.objects[request.resource, request.namespace, request.name]
        except KeyError:
            return None
        return None if obj.deleted else dict(obj.raw)

    def _emulate_put(self, request: Any, live: dict[str, Any] | None) -> None:
        """PUT replaces the object (kmock has no PUT): the merge patch from what is stored to
        what was sent, keeping the status and what the server sets in metadata."""
        if live is None:
            raise KubernetesError(status=404, reason="NotFound",
                                  message=f'{request.resource.plural} "{request.name}" not found')  # fmt: skip
        if not isinstance(request.data, dict):
            raise KubernetesError(status=400, reason="BadRequest", message="not an object")
        faults.check_resource_version(request.resource.plural, live, request.data)
        target = copy.deepcopy(request.data)
        meta = target.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "generation", "managedFields", "resourceVersion"):
            if key in live.get("metadata", {}):
                meta[key] = live["metadata"][key]
        if "status" in live:
            target["status"] = live["status"]
        _rewrite(request, action=enums.action.UPDATE,
                 data=emulation.merge_patch_between(live, target))  # fmt: skip

    def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
        # kmock scans every stored object for every request (O(n) per request); a named,
        # strict lookup is one dict access. Anything else keeps kmock's own scan.
        if strict and request.name is not None:
            try:
                return [self.objects[request.resource, request.namespace, request.name]]
            except KeyError:
                return []
        return super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]

    def _emulate_write(self, request: Any) -> None:
        """Server-side apply, field ownership and quantity validation (see apply_emulation)."""
        if request.action not in (enums.action.CREATE, enums.action.UPDATE):
            return
        plural = request.resource.plural
        kind = next((i["kind"] for p, i in RESOURCES.items() if p.endswith(f"/{plural}")), plural)
        live: dict[str, Any] | None = None
        if request.action == enums.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            try:
                obj = self.objects[key]  # (kmock's ObjectsArray has no .get)
                live = None if obj.deleted else obj.raw
            except KeyError:
                live = None
        manager = emulation.manager_of(request.params, request.headers)
        content_type = next(
            (v for k, v in request.headers.items() if k.lower() == "content-type"), ""
        )
        if request.action == enums.action.UPDATE and content_type.startswith(
            emulation.APPLY_CONTENT_TYPE
        ):
            if not isinstance(request.data, dict):
                raise KubernetesError(status=400, reason="BadRequest", message="not an object")
            force = request.params.get("force") == "true"
            result = emulation.apply(live, request.data, manager, force=force, plural=plural)
            emulation.check_quantities(plural, kind, result)
            if live is None:  # an apply creates what is absent
                meta = result.setdefault("metadata", {})
                meta.setdefault("name", request.name)
                meta.setdefault("namespace", request.namespace)
                _rewrite(request, action=enums.action.CREATE, data=result)
            else:  # as the merge patch that turns the live object into the result
                _rewrite(request, data=emulation.merge_patch_between(live, result))
            return
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            after: dict[str, Any] = request.data
        elif live is not None and isinstance(request.data, (dict, list)):
            after = dict(patch_dict(live, request.data))
        else:
            return  # kmock answers (404 for a patch of nothing)
        emulation.check_quantities(plural, kind, after)
        faults.check_configmap_size(plural, after)
        given = (after.get("metadata") or {}).get("managedFields")
        if plural in emulation.TRACKED and given == ((live or {}).get("metadata") or {}).get(
            "managedFields"
        ):  # (a write that sets managedFields itself is taken as it is, as the server does)
            fields = emulation.update_managed_fields(live, after, manager, plural)
            if isinstance(request.data, dict):
                request.data.setdefault("metadata", {})["managedFields"] = fields
            else:
                request.data.append(
                    {"op": "add", "path": "/metadata/managedFields", "value": fields}
                )

    def _on_create(self, data: dict[str, Any]) -> None:
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._rv))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def _on_update(self, request: Any, data: dict[str, Any]) -> None:
        if request.subresource == "status":
            for key in [k for k in data if k != "status"]:
                del data[key]
        else:
            data.pop("status", None)
            if "spec" in data:
                data.setdefault("metadata", {})["generation"] = self._generation(request) + 1
        data.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))

    def _generation(self, request: Any) -> int:
        try:
            obj = self.objects[request.resource, request.namespace, request.name]
            return int(obj.get("metadata", {}).get("generation") or 1)
        except (KeyError, ValueError):
            return 1


def _created_name(data: Any) -> str | None:
    """The name a create asks for (a create's URL names none)."""
    name = ((data if isinstance(data, dict) else {}).get("metadata") or {}).get("name")
    return str(name) if name else None


def _rewrite(request: Any, **changes: Any) -> None:
    """Change a parsed request in place: kmock serves only the requests it logged (identity)."""
    for attr, value in changes.items():
        object.__setattr__(request, attr, value)


# ------------------------------------------------------------------ reading the emulator's state


def objects(api: FakeApiServer, plural: str, namespace: str | None = NS) -> list[dict[str, Any]]:
    out = []
    for (res, ns, _), obj in list(api.objects.items()):
        if res.plural == plural and (namespace is None or ns == namespace) and not obj.deleted:
            out.append(obj.raw)
    return out


def get(api: FakeApiServer, plural: str, name: str, namespace: str = NS) -> dict[str, Any] | None:
    return next((o for o in objects(api, plural, namespace) if o["metadata"]["name"] == name), None)


def idf(api: FakeApiServer, name: str) -> dict[str, Any]:
    """The InferenceDeployment `name` (it must exist)."""
    obj = get(api, "inferencedeployments", name)
    assert obj is not None
    return obj


def events_for(api: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [
        e for e in objects(api, "events") if (e.get("involvedObject") or {}).get("name") == name
    ]


async def warning_events(api: FakeApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    """Wait for Warning events with `reason` about object `name`, and return them."""
    events: list[dict[str, Any]] = await wait_for(
        lambda: [
            e for e in events_for(api, name) if e["type"] == "Warning" and e["reason"] == reason
        ],
        what=f"a {reason} warning event",
    )
    return events


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def creations(api: FakeApiServer, plural: str, component: str | None = None) -> int:
    """Create requests of ``plural`` (of one ``app.kubernetes.io/component`` when given)."""
    return sum(
        1
        for r in api
        if r.action == enums.action.CREATE
        and r.resource is not None
        and r.resource.plural == plural
        and (component is None or _component(r.data) == component)
    )


def _component(data: Any) -> str | None:
    labels = ((data if isinstance(data, dict) else {}).get("metadata") or {}).get("labels") or {}
    value = labels.get("app.kubernetes.io/component")
    return str(value) if value is not None else None


def tuner_jobs_created(api: FakeApiServer) -> int:
    """Tuner Jobs created (verification and retune Jobs are counted apart)."""
    return creations(api, "jobs", "tuner")


async def wait_for(
    probe: Callable[[], Any], *, timeout: float = 10.0, what: str = "condition"
) -> Any:
    """Poll until probe() returns something truthy; fail with the last value after timeout."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")


@dataclass
class OperatorRunner:
    """The real operator (kopf.operator) in a thread with its own event loop."""

    url: str
    settings: Settings = SETTINGS
    resync_interval: float = 60.0
    backoff: Backoff | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)
    _exited: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def _login(self, **_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=self.url, insecure=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._operate())
        except BaseException as exc:  # surfaced by stop()
            self.errors.append(exc)

    async def _operate(self) -> None:
        from infertune_operator.engine.handlers import run_operator

        try:
            await run_operator(
                kube=Kube.for_url(self.url),
                settings=self.settings,
                clusterwide=True,
                login=self._login,
                resync_interval=self.resync_interval,
                backoff=self.backoff,
                stop_flag=self._stop,
                ready_flag=self._ready,
            )
        finally:
            self._exited.set()

    @property
    def running(self) -> bool:
        """Whether the operator runs: started and not ended, by an error or otherwise. (Its
        thread outlives it until stop(): Kopf waits for a threading stop flag in a thread.)"""
        return self._thread is not None and not self._exited.is_set()

    async def start(self) -> OperatorRunner:
        self._stop, self._ready = threading.Event(), threading.Event()
        self._exited = threading.Event()
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self._thread.start()
        ok = await asyncio.to_thread(self._ready.wait, 10)
        assert ok, "the operator did not start within 10 s"
        return self

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 15)
        assert not self._thread.is_alive(), "the operator did not stop within 15 s"
        self._thread = None
        assert not self.errors, f"the operator crashed: {self.errors!r}"


# ------------------------------------------------------------------ manifests


def manifest(name: str = "llm", **overrides: Any) -> dict[str, Any]:
    """A small simulated-backend InferenceDeployment (real tuning takes well under a second)."""
    spec: dict[str, Any] = {
        "model": {"name": "llama-3-8b"},
        "gpu": {"product": "L4-24GB", "maxGpusPerReplica": 2},
        "workload": {"inputTokens": 512, "outputTokens": 128},
        "slo": {"e2eLatencyMs": {"p95": 20000}},
        "search": {
            "tensorParallel": [1, 2],
            "maxBatchSize": [4, 8, 16],
            "quantization": ["fp8"],
            "kvCacheDtype": ["auto"],
        },
        "tuning": {"backend": "simulated", "maxTrials": 6, "seed": 1},
    }
    for key, value in overrides.items():
        spec[key] = value
    return {
        "apiVersion": "infertune.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": spec,
    }


async def create(api: FakeApiServer, body: dict[str, Any]) -> dict[str, Any]:
    return await post(api, "inferencedeployments", body)


GROUP_VERSIONS = {
    "inferencedeployments": "/apis/infertune.io/v1alpha1",
    "jobs": "/apis/batch/v1",
    "deployments": "/apis/apps/v1",
    "rolebindings": "/apis/rbac.authorization.k8s.io/v1",
}


def collection_path(plural: str, namespace: str = NS) -> str:
    return f"{GROUP_VERSIONS.get(plural, '/api/v1')}/namespaces/{namespace}/{plural}"


def path_of(plural: str, name: str, namespace: str = NS, sub: str = "") -> str:
    return f"{collection_path(plural, namespace)}/{name}" + (f"/{sub}" if sub else "")


async def patch(
    api: FakeApiServer, plural: str, name: str, body: dict[str, Any], sub: str = ""
) -> dict[str, Any]:
    async with api.patch(path_of(plural, name, sub=sub), json=body) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


async def post(api: FakeApiServer, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    async with api.post(collection_path(plural), json=body) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


async def delete(api: FakeApiServer, plural: str, name: str) -> None:
    async with api.delete(path_of(plural, name)) as resp:
        assert resp.status == 200, await resp.text()


async def start_operator(
    api: FakeApiServer,
    settings: Settings = SETTINGS,
    *,
    resync_interval: float = 60.0,
    backoff: Backoff | None = None,
) -> OperatorRunner:
    return await OperatorRunner(api_url(api), settings, resync_interval, backoff).start()


# kube-apiserver's limit on a request body (MaxRequestBodyBytes, 3 MiB): aiohttp's own default,
# 1 MiB, would refuse a ConfigMap of exactly 1 MiB with 413 before the API's own 422.
MAX_REQUEST_BODY = 3 * 1024 * 1024


class ApiServerHttp(aiohttp.test_utils.RawTestServer):
    """The emulator's HTTP server, taking request bodies as large as kube-apiserver does."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> aiohttp.web.ServerRunner:
        server = aiohttp.web.Server(self._handler, loop=self._loop, debug=debug, **kwargs)

        def request(*args: Any) -> aiohttp.web.BaseRequest:
            return aiohttp.web.BaseRequest(*args, server._loop, client_max_size=MAX_REQUEST_BODY)

        server.request_factory = request
        return aiohttp.web.ServerRunner(server, debug=debug, **kwargs)


def declare_resources(handler: FakeApiServer) -> None:
    for path, info in RESOURCES.items():
        handler.resources[path] = kmock.ResourceInfo(
            kind=info["kind"],
            namespaced=info.get("namespaced", True),
            verbs=VERBS,
            subresources=info.get("subresources", set()),
        )


def api_url(api: FakeApiServer) -> str:
    return str(api.url).rstrip("/")


async def seed_report(
    api: FakeApiServer, body: dict[str, Any], tmp_path: Path, settings: Settings = SETTINGS
) -> Report:
    """A report ConfigMap for this spec's hash (under the operator's `settings`), as a finished
    tuner Job would have left it (replacing the report of an earlier spec, as the next tuner
    Job would)."""
    from infertune_operator.api.to_request import to_request
    from infertune_operator.policy.tuning import tuning_hash, validate
    from infertune_operator.reports.store import report_configmap
    from infertune_tuner.run import tune

    name = body["metadata"]["name"]
    th = tuning_hash(body["spec"], settings)
    obj, problems = validate(body)
    assert obj is not None, problems
    report = tune(to_request(obj), backend="simulated", out_dir=tmp_path / f"{name}-{th}")
    cm = report_configmap(name=name, namespace=NS, report=report, th=th, owner_uid=None)
    if get(api, "configmaps", cm["metadata"]["name"]) is None:
        await post(api, "configmaps", cm)
    else:
        await patch(api, "configmaps", cm["metadata"]["name"], cm)
    return report


# ------------------------------------------------------------------ playing the controllers


async def run_tuner(
    api: FakeApiServer,
    job: dict[str, Any],
    workdir: Path,
    env: dict[str, str] | None = None,
    *,
    request: str | None = None,
) -> str:
    """Play the kubelet: run the Job's own command (`infertune tune-job ...`) as a process.

    Needs the ``kubeconfig`` fixture: the command talks to the emulator as a pod would talk to
    its API server. Only the request file path differs (the pod mounts the ConfigMap).
    `env`: what the pod's environment adds (a Secret's content, the worker's GPUs).
    `request`: the request the pod mounted, when its ConfigMap is gone by now (a pod that
    outlives its superseded Job).
    """
    pod = job["spec"]["template"]["spec"]
    command = list(pod["containers"][0]["command"])
    assert command[:2] == ["infertune", "tune-job"], command
    cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    if request is None:
        cm = get(api, "configmaps", cm_name)
        assert cm is not None, f"request ConfigMap {cm_name} missing"
        request = str(cm["data"]["request.json"])
    request_file = workdir / f"{cm_name}.json"
    request_file.write_text(request, encoding="utf-8")
    command[0] = str(Path(sys.executable).with_name("infertune"))
    command[command.index("--request") + 1] = str(request_file)
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": os.environ["KUBECONFIG"], **(env or {})},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def start_job(api: FakeApiServer, name: str) -> None:
    """Play the Job controller and the kubelet: the tuner pod is running."""
    status = {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"}
    await patch(api, "jobs", name, {"status": status}, sub="status")


async def finish_job(
    api: FakeApiServer,
    name: str,
    *,
    succeeded: bool = True,
    reason: str = "BackoffLimitExceeded",
    message: str = "Job has reached the specified backoff limit",
) -> None:
    """Play the Job controller: mark the Job Complete (or Failed: after its retries, or on its
    deadline with ``reason="DeadlineExceeded"``)."""
    if succeeded:
        status = {"succeeded": 1, "active": 0,
                  "conditions": [{"type": "Complete", "status": "True"}]}  # fmt: skip
    else:
        status = {
            "failed": 3,
            "active": 0,
            "conditions": [
                {"type": "Failed", "status": "True", "reason": reason, "message": message}
            ],
        }
    await patch(api, "jobs", name, {"status": status}, sub="status")


async def make_available(api: FakeApiServer, name: str, replicas: int) -> None:
    """Play the Deployment controller: report `replicas` updated, available replicas."""
    live = get(api, "deployments", name)
    assert live is not None
    status = {
        "observedGeneration": live["metadata"].get("generation", 1),
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
    await patch(api, "deployments", name, {"status": status}, sub="status")


def jobs_of(api: FakeApiServer, name: str, component: str = "tuner") -> list[dict[str, Any]]:
    """The Jobs of one component (tuner, verification, retune) of InferenceDeployment ``name``."""
    return [
        j
        for j in objects(api, "jobs")
        if (j["metadata"].get("labels") or {}).get("infertune.io/deployment") == name
        and (j["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component
    ]


def phase(api: FakeApiServer, name: str) -> str | None:
    obj = get(api, "inferencedeployments", name)
    return ((obj or {}).get("status") or {}).get("phase")
