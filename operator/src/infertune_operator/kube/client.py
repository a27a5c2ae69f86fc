"""The Kubernetes boundary: the only module that imports the ``kubernetes`` client.

Everything else in the operator works on plain dicts (what ``kubectl get -o json`` shows) and on
the small exception types of ``errors``, so the pure core (``policy``, ``objects``, ``api``) never sees
the client. The client is used at its lowest level (``ApiClient`` + JSON), not through the typed
API classes: no model (de)serialisation, one code path for every resource, CRDs included.

Verbs used here, per resource (the Helm chart's ClusterRole must allow them; see
``docs/operator.md``):

================================  ==========================================================
inferencedeployments              get
inferencedeployments/status       patch
jobs (batch)                      get, list, create, delete
configmaps                        get, list, create, patch, delete (tuner Jobs: get, create, update)
deployments (apps)                get, patch (+ create: a server-side apply that creates)
services                          get, patch (+ create: a server-side apply that creates)
pods                              list
pods/log                          get
pods/proxy                        get (a serving pod's metrics endpoint)
serviceaccounts                   get, create
rolebindings (rbac)               get, create  (+ ``bind`` on the tuner ClusterRole)
================================  ==========================================================

How each kind of object is written (the choice is per object type):

* The serving objects (model-repo ConfigMap, Deployment, Service) are server-side applied
  (:meth:`Kube.apply`, field manager ``infertune``, forced): they follow the spec over time, and
  only server-side apply removes what a new render leaves out (a JSON merge patch of the whole
  object keeps every key the patch does not mention: a dropped nodeSelector key, the toleration of
  an earlier GPU pool) while keeping what others add (an annotation, a sidecar's field).
* The tuner Job and its request ConfigMap are created once (:meth:`Kube.create`): both are named
  by the tuning hash, a Job's pod template is immutable, and a new spec means a new Job.
* The tuner's ServiceAccount and RoleBinding are get-or-create (:meth:`Kube.ensure`): shared by
  every InferenceDeployment of the namespace, never changed.
* The status is a JSON merge patch of the status subresource: only the keys the operator owns.

Failed calls raise the errors of ``errors`` (4xx :class:`ClientError`, 5xx
:class:`ServerError`, :class:`Unreachable`), the client's exception chained as the cause.

Kopf itself additionally watches inferencedeployments, jobs and deployments (list, watch),
patches inferencedeployments (its annotations), posts events, and reads CRDs and namespaces.

The client configuration is injectable: :meth:`Kube.from_environment` (in-cluster service account
or kubeconfig, like kubectl) for real use, :meth:`Kube.for_url` for tests against a mock server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from infertune_operator.kube.errors import (
    ClientError,
    Conflict,
    KubeConfigError,
    NotFound,
    from_response,
    unreachable,
)
from infertune_operator.kube.managed_fields import adopt_legacy_fields
from infertune_operator.kube.resources import (
    PODS,
    Resource,
    label_selector,
    labels_match,
    resource_of,
)
from infertune_operator.naming import MANAGER, Body
from infertune_tuner.errors import InputError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Server-side apply: the body is the object as we want it (JSON is valid YAML).
APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = MANAGER  # "infertune": the field manager of everything the operator writes
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_TIMEOUT_S: tuple[float, float] = (5.0, 30.0)  # (connect, read)
# Kept-alive connections per API server: one per concurrent caller, or urllib3 opens and drops
# a connection per request beyond it. Callers: Kopf's handler threads (handlers.HANDLER_THREADS)
# and the resync's executor thread.
CONNECTION_POOL_MAXSIZE = 64


# ------------------------------------------------------------------ client


class Kube:
    """A thin, thread-safe JSON client for the handful of calls the operator makes."""

    def __init__(self, api_client: k8s_client.ApiClient, default_namespace: str = "default"):
        self._api = api_client
        self.default_namespace = default_namespace
        self.timeout = DEFAULT_TIMEOUT_S

    # ---- construction

    @classmethod
    def for_url(cls, url: str, *, token: str | None = None, verify_ssl: bool = False) -> Kube:
        """A client for one API server URL (tests, port-forwards, mock servers)."""
        cfg = _configuration()
        cfg.host = url.rstrip("/")
        cfg.verify_ssl = verify_ssl
        if token:
            cfg.api_key = {"authorization": token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        return cls(k8s_client.ApiClient(cfg))

    @classmethod
    def from_environment(cls, *, context: str | None = None) -> Kube:
        """In a pod: its service account. Elsewhere: the kubeconfig (KUBECONFIG or ~/.kube)."""
        cfg = _configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
            namespace = _read_text(SA_NAMESPACE_FILE) or "default"
        except ConfigException:
            try:
                k8s_config.load_kube_config(
                    config_file=_kubeconfig_path(), context=context, client_configuration=cfg
                )
            except (ConfigException, OSError, TypeError, ValueError) as exc:
                raise KubeConfigError(
                    f"no in-cluster service account and no usable kubeconfig ({exc})"
                ) from None
            namespace = _kubeconfig_namespace(context)
        return cls(k8s_client.ApiClient(cfg), default_namespace=namespace)

    def close(self) -> None:
        self._api.close()

    # ---- raw calls

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        what: str,
        raw: bool = False,
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if raw:
            headers["Accept"] = "*/*"
        try:
            serialized = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*serialized, _request_timeout=timeout or self.timeout)
            data = response.read()
            if not 200 <= response.status <= 299:  # the client's own exception, chained below
                text = data.decode("utf-8", "replace")
                ApiException.from_response(http_resp=response, body=text, data=None)
        except ApiException as exc:
            status, reason = int(exc.status or 0), str(exc.reason or "")
            headers = exc.headers or {}
            retry_after = headers.get("Retry-After") if hasattr(headers, "get") else None
            raise from_response(status, reason, exc.body, what, retry_after=retry_after) from exc
        except Exception as exc:  # urllib3 connection errors, TLS, timeouts
            raise unreachable(exc, what) from exc
        if raw:
            return data.decode("utf-8", "replace")
        return json.loads(data) if data else {}

    # ---- CRUD on plain dicts

    def get(self, res: Resource, namespace: str | None, name: str) -> Body | None:
        """The object, or None when it does not exist."""
        try:
            result: Body = self._call(
                "GET", res.path(namespace, name), what=f"get {res.plural}/{name}"
            )
        except NotFound:
            return None
        return result

    def list(
        self, res: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[Body]:
        query = [("labelSelector", label_selector(labels))] if labels else None
        result = self._call("GET", res.path(namespace), query=query, what=f"list {res.plural}")
        items: list[Body] = list(result.get("items") or [])
        # The server filters already; filtering again keeps us honest with servers that don't.
        return [i for i in items if labels_match(i, labels or {})]

    def create(self, body: Body) -> tuple[Body, bool]:
        """Create; on 409 AlreadyExists adopt the existing object. Returns (object, created)."""
        res = resource_of(body)
        meta = body.get("metadata", {})
        namespace, name = meta.get("namespace"), meta.get("name", "")
        try:
            created: Body = self._call(
                "POST", res.path(namespace), body=body, query=[("fieldManager", FIELD_MANAGER)],
                what=f"create {res.plural}/{name}",
            )  # fmt: skip
            return created, True
        except Conflict:
            existing = self.get(res, namespace, name)
            if existing is None:  # deleted in between: let the caller retry
                raise
            return existing, False

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Body,
        *,
        subresource: str = "",
    ) -> Body:
        """JSON merge patch (RFC 7386): dicts merge, lists and scalars replace, null deletes."""
        path = res.path(namespace, name, subresource)
        what = f"patch {res.plural}/{name}{'/' + subresource if subresource else ''}"
        query = [("fieldManager", FIELD_MANAGER)]
        result: Body = self._call(
            "PATCH", path, body=patch, query=query, content_type=MERGE_PATCH, what=what
        )
        return result

    def replace(self, body: Body) -> Body:
        """Replace (PUT) the whole object. With ``metadata.resourceVersion`` set, the API server
        refuses with 409 Conflict when the object changed since it was read (optimistic
        concurrency: a writer that lost the race reads again and decides again)."""
        res = resource_of(body)
        meta = body.get("metadata", {})
        namespace, name = meta.get("namespace"), meta.get("name", "")
        result: Body = self._call(
            "PUT", res.path(namespace, name), body=body, query=[("fieldManager", FIELD_MANAGER)],
            what=f"replace {res.plural}/{name}",
        )  # fmt: skip
        return result

    def delete(
        self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None
    ) -> bool:
        """Delete with background propagation (a Job takes its pods along). False if absent.

        ``uid``: delete only that object (a precondition: 409 Conflict when the name now belongs
        to another object), never one created in its place since it was read.
        """
        body: Body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call(
                "DELETE", res.path(namespace, name), body=body, what=f"delete {res.plural}/{name}"
            )
        except NotFound:
            return False
        return True

    def pod_log_tail(self, namespace: str, pod: str, container: str, lines: int = 5) -> str:
        query = [("container", container), ("tailLines", str(lines))]
        text: str = self._call(
            "GET", PODS.path(namespace, pod, "log"), query=query, raw=True, what=f"logs of {pod}"
        )
        return text

    def proxy_get(
        self, namespace: str, pod: str, port: int, path: str, timeout_s: float = 5.0
    ) -> str:
        """GET ``path`` on a pod's ``port`` through the API server's proxy
        (``pods/<pod>:<port>/proxy/<path>``, RBAC ``pods/proxy``: get): a serving pod's metrics
        endpoint, reachable wherever the operator reaches the API server."""
        base = PODS.path(namespace, pod)
        text: str = self._call(
            "GET", f"{base}:{port}/proxy/{path.lstrip('/')}", raw=True,
            what=f"GET {path} of pod {pod}:{port}", timeout=(min(timeout_s, 5.0), timeout_s),
        )  # fmt: skip
        return text

    # ---- composite helpers

    def server_side_apply(self, desired: Body) -> Body:
        """Server-side apply ``desired`` as field manager ``infertune``, forcing conflicts.

        Creates the object when it is absent. The API server keeps, per field manager, the set
        of fields each one last applied (``metadata.managedFields``): a field infertune applied
        before and leaves out now is removed, unless another manager also owns it; fields other
        managers set are left alone. ``force``: a field another manager took over (say someone
        edited the Deployment's image) is taken back, as a controller must.
        See https://kubernetes.io/docs/reference/using-api/server-side-apply/
        """
        res = resource_of(desired)
        meta = desired["metadata"]
        name = meta["name"]
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        result: Body = self._call(
            "PATCH", res.path(meta.get("namespace"), name), body=desired, query=query,
            content_type=APPLY_PATCH, what=f"apply {res.plural}/{name}",
        )  # fmt: skip
        return result

    def apply(self, desired: Body, *, changed: Callable[[Body, Body], bool] | None = None) -> Body:
        """Server-side apply (:meth:`server_side_apply`) unless ``changed(live, desired)`` says
        the live object needs nothing (the render-hash skip: one GET instead of a write).

        An object an earlier, merge-patching version wrote first gets its fields handed to the
        ``infertune`` manager (``managed_fields``), then the apply, whatever the render hash
        says: that apply removes what such a version left behind.
        """
        if changed is not None:
            res = resource_of(desired)
            meta = desired["metadata"]
            live = self.get(res, meta.get("namespace"), meta["name"])
            adopted = live is not None and self._adopt_legacy_fields(res, live)
            if live is not None and not adopted and not changed(live, desired):
                return live
        return self.server_side_apply(desired)

    def _adopt_legacy_fields(self, res: Resource, live: Body) -> bool:
        patch = adopt_legacy_fields(live, FIELD_MANAGER)
        if patch is None:
            return False
        meta = live["metadata"]
        try:
            self._call(
                "PATCH", res.path(meta.get("namespace"), meta["name"]), body=patch,
                content_type=JSON_PATCH, what=f"adopt the fields of {res.plural}/{meta['name']}",
            )  # fmt: skip
        except ClientError:  # written in between (the test op failed): the next apply retries
            return False
        return True

    def ensure(self, body: Body) -> bool:
        """Get-or-create (for shared objects the operator never changes). True if created."""
        res = resource_of(body)
        meta = body["metadata"]
        if self.get(res, meta.get("namespace"), meta["name"]) is not None:
            return False
        _, created = self.create(body)
        return created


# ------------------------------------------------------------------ helpers


def connect() -> Kube:
    """The cluster a command works on (:meth:`Kube.from_environment`), or an InputError that
    says in one line why there is none (exit 2, no traceback)."""
    import yaml

    try:
        return Kube.from_environment()
    except KubeConfigError as exc:
        raise InputError(f"cannot reach a cluster: {exc}") from None
    except yaml.YAMLError as exc:  # the client parses the kubeconfig and lets this through
        raise InputError(f"cannot reach a cluster: the kubeconfig is not YAML: {exc}") from None


def _configuration() -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    cfg.connection_pool_maxsize = CONNECTION_POOL_MAXSIZE
    # urllib3's default retries a GET, PUT or DELETE answered 429/503 with a Retry-After by
    # itself, sleeping exactly that long in the handler thread: every object throttled together
    # would come back in the same instant, unseen by the status. Those answers go to the
    # operator's own backoff (policy.backoff: jittered, shown as Synced=False); only a
    # connection that fails before any answer is retried here, as before.
    cfg.retries = urllib3.util.Retry(total=3, respect_retry_after_header=False)
    return cfg


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _kubeconfig_path() -> str:
    # Read now, not at import time as the client does (the environment may have changed since).
    return os.environ.get("KUBECONFIG") or "~/.kube/config"


def _kubeconfig_namespace(context: str | None) -> str:
    try:
        contexts, active = k8s_config.list_kube_config_contexts(config_file=_kubeconfig_path())
    except (ConfigException, OSError, TypeError, ValueError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")
