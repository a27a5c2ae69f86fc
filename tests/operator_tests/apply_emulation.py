"""Two things a real API server does that kmock leaves out: server-side apply with field
ownership, and the validation of resource quantities in pod templates.

Server-side apply (https://kubernetes.io/docs/reference/using-api/server-side-apply/), to the
extent the operator relies on it:

* A PATCH with ``Content-Type: application/apply-patch+yaml`` and ``?fieldManager=M`` merges the
  applied configuration into the live object (creating it when absent) and records the fields it
  set as owned by ``M`` (operation ``Apply``) in ``metadata.managedFields`` (``FieldsV1``).
* "If you remove a field from a manifest and apply that manifest, Server-Side Apply checks if
  there are any other field managers that also own the field. If the field is not owned by any
  other field managers, it is either deleted from the live object or reset to its default
  value": fields ``M`` applied before and leaves out now are removed unless another manager
  owns them; fields only other managers set are never touched.
* Applying a different value to a field another manager owns is a conflict (409) unless
  ``force=true``, which moves the ownership to the applier. Two managers that apply the same
  value share the field.
* Non-apply writes (POST, merge or JSON patch) are ``Update`` operations: "whenever a field's
  value does change, ownership moves from its current manager to the manager making the
  change" (the ``fieldManager`` parameter, or the User-Agent's product name).

Which maps are one field (``x-kubernetes-map-type: atomic``: a pod's ``nodeSelector``, a label
selector) comes from the Kubernetes OpenAPI schema that kubernetes-validate ships. Simplifications:
every list is one field (as ``x-kubernetes-list-type: atomic``, which ``tolerations`` is; the real
server merges associative lists such as ``containers`` item by item by their key), no defaulting,
and ownership is tracked on the kinds the operator applies (``TRACKED``).

Quantities: the real server decodes ``resources.requests``/``limits`` with apimachinery's
``resource.ParseQuantity``: a malformed quantity is 400 BadRequest ("Deployment in version "v1"
cannot be handled as a Deployment: quantities must match the regular expression ..."), and
validation rejects a negative one with 422 Invalid ("must be greater than or equal to 0").
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path as Path_
from typing import Any

import kubernetes_validate
from kmock._internal.k8s import KubernetesError

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
TRACKED = frozenset({"deployments", "services", "configmaps"})
POD_TEMPLATE_KINDS = {"deployments": ("spec", "template", "spec"),
                      "jobs": ("spec", "template", "spec"), "pods": ("spec",)}  # fmt: skip

Path = tuple[str, ...]
# Set by the server, never owned by a manager (identity, bookkeeping, status).
UNOWNED: frozenset[Path] = frozenset(
    {("apiVersion",), ("kind",), ("status",)}
    | {("metadata", k) for k in ("name", "namespace", "uid", "resourceVersion", "generation",
                                 "creationTimestamp", "managedFields", "deletionTimestamp")}
)  # fmt: skip


# ------------------------------------------------------------------ field sets


def _schema_definitions() -> dict[str, Any]:
    """The Kubernetes OpenAPI definitions kubernetes-validate ships (the newest version)."""
    root = Path_(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    versions = [d for d in root.iterdir() if d.name.endswith("-local")]
    newest = max(versions, key=lambda d: tuple(int(x) for x in d.name[1:-6].split(".")))
    with (newest / "_definitions.json").open(encoding="utf-8") as f:
        defs: dict[str, Any] = json.load(f)["$defs"]
    return defs


DEFINITIONS = _schema_definitions()
ROOT_TYPES = {"deployments": "io.k8s.api.apps.v1.Deployment",
              "services": "io.k8s.api.core.v1.Service",
              "configmaps": "io.k8s.api.core.v1.ConfigMap"}  # fmt: skip


def _resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = DEFINITIONS[str(schema["$ref"]).rsplit("/", 1)[-1]]
    return schema


def _child(schema: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    if schema is None:
        return None
    node = _resolve(schema)
    if key in (node.get("properties") or {}):
        child: Mapping[str, Any] = node["properties"][key]
        return child
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _atomic_map(schema: Mapping[str, Any] | None) -> bool:
    """``x-kubernetes-map-type: atomic`` (a nodeSelector, a label selector): one field."""
    if schema is None:
        return False
    return "atomic" in (schema.get("x-kubernetes-map-type"), _resolve(schema).get(
        "x-kubernetes-map-type"))  # fmt: skip


def leaf_paths(
    obj: Mapping[str, Any], prefix: Path = (), schema: Mapping[str, Any] | None = None
) -> set[Path]:
    """The fields of an object: map keys recursively (granular maps and structs), anything else
    (lists, atomic maps, scalars) is one field."""
    out: set[Path] = set()
    for key, value in obj.items():
        path = (*prefix, key)
        if path in UNOWNED:
            continue
        sub = _child(schema, key)
        if isinstance(value, Mapping) and value and not _atomic_map(sub):
            out |= leaf_paths(value, path, sub)
        else:
            out.add(path)
    return out


def _root_schema(plural: str) -> Mapping[str, Any] | None:
    root = ROOT_TYPES.get(plural)
    return {"$ref": f"#/$defs/{root}"} if root else None


def fields_of(obj: Mapping[str, Any], plural: str) -> set[Path]:
    return leaf_paths(obj, (), _root_schema(plural))


def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    """FieldsV1, as the real server writes it: ``{"f:spec": {"f:replicas": {}}}``."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def from_fields_v1(fields: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in fields.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        children = {k: v for k, v in (sub or {}).items() if k != "."}
        out |= from_fields_v1(children, path) if children else {path}
    return out


def _lookup(obj: Mapping[str, Any], path: Path) -> tuple[bool, Any]:
    node: Any = obj
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Delete a field, and the maps the deletion left empty."""
    parents: list[tuple[dict[str, Any], str]] = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return
        parents.append((node, key))
        node = node[key]
    node.pop(path[-1], None)
    for parent, key in reversed(parents):
        if parent[key]:
            break
        del parent[key]


def _merge(
    live: dict[str, Any], config: Mapping[str, Any], schema: Mapping[str, Any] | None
) -> None:
    """Merge maps and structs key by key; lists, atomic maps and scalars are replaced."""
    for key, value in config.items():
        sub = _child(schema, key)
        if isinstance(value, Mapping) and isinstance(live.get(key), dict) and not _atomic_map(sub):
            _merge(live[key], value, sub)
        else:
            live[key] = copy.deepcopy(value)


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


Owners = dict[tuple[str, str], set[Path]]  # (manager, operation) -> fields


def owners(obj: Mapping[str, Any] | None) -> Owners:
    out: Owners = {}
    for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
        key = (str(entry.get("manager")), str(entry.get("operation")))
        out[key] = out.get(key, set()) | from_fields_v1(entry.get("fieldsV1") or {})
    return out


def _managed_fields(entries: Owners, api_version: str) -> list[dict[str, Any]]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [
        {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
        for (manager, operation), paths in sorted(entries.items())
        if paths
    ]  # fmt: skip


# ------------------------------------------------------------------ apply and update


def apply(
    live: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    manager: str,
    *,
    force: bool,
    plural: str,
) -> dict[str, Any]:
    """The object after ``manager`` applies ``config`` (409 on conflicts unless forced)."""
    applied = fields_of(config, plural)
    entries = owners(live)
    before = entries.pop((manager, "Apply"), set())
    conflicts = [
        (other, path)
        for other, paths in entries.items()
        for path in sorted(paths & applied)
        if live is not None and _lookup(live, path) != _lookup(config, path)
    ]
    if conflicts and not force:
        listing = "\n".join(f'- conflict with "{m}": .{".".join(p)}' for (m, _), p in conflicts)
        raise KubernetesError(
            status=409, reason="Conflict",
            message=f"Apply failed with {len(conflicts)} conflict(s):\n{listing}",
            details={"causes": [{"reason": "FieldManagerConflict", "field": ".".join(p)}
                                for _, p in conflicts]},
        )  # fmt: skip
    for other, path in conflicts:  # forced: the applier takes the field over
        entries[other].discard(path)
    result: dict[str, Any] = copy.deepcopy(dict(live or {}))
    for path in sorted(before - applied):
        if not any(_overlaps(path, p) for paths in entries.values() for p in paths):
            _remove(result, path)
    _merge(result, config, _root_schema(plural))
    entries[(manager, "Apply")] = applied
    result.setdefault("metadata", {})["managedFields"] = _managed_fields(
        entries, str(config.get("apiVersion", ""))
    )
    return result


def update_managed_fields(
    before: Mapping[str, Any] | None, after: Mapping[str, Any], manager: str, plural: str
) -> list[dict[str, Any]]:
    """managedFields after a non-apply write by ``manager`` turned ``before`` into ``after``."""
    old = fields_of(before or {}, plural)
    new = fields_of(after, plural)
    changed = {p for p in new if _lookup(before or {}, p) != _lookup(after, p)}
    gone = old - new
    entries = owners(before)
    for paths in entries.values():
        paths -= changed | gone
    entries[(manager, "Update")] = entries.get((manager, "Update"), set()) | changed
    return _managed_fields(entries, str(after.get("apiVersion", "")))


def merge_patch_between(live: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``live`` into ``target``."""
    patch: dict[str, Any] = {key: None for key in live if key not in target}
    for key, value in target.items():
        old = live.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping) and value and old:
            sub = merge_patch_between(old, value)
            if sub:
                patch[key] = sub
        elif key not in live or old != value:
            patch[key] = copy.deepcopy(value)
    return patch


def manager_of(params: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """The field manager of a request: ``?fieldManager=``, else the User-Agent's product."""
    agent = next((v for k, v in headers.items() if k.lower() == "user-agent"), "unknown")
    return params.get("fieldManager") or agent.split("/")[0] or "unknown"


# ------------------------------------------------------------------ quantities

# k8s.io/apimachinery/pkg/api/resource/quantity.go: splitREString and the suffixes it accepts.
SPLIT_RE = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_WRONG = f"quantities must match the regular expression '{SPLIT_RE}'"
SUFFIXES = {"", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
NUMBER_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)")


def quantity_problem(value: Any) -> tuple[int, str] | None:
    """(400, why) for what ParseQuantity rejects, (422, why) for a negative quantity."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 400, FORMAT_WRONG
    text = str(value)
    match = re.match(SPLIT_RE, text)
    if match is None:
        return 400, FORMAT_WRONG
    number, suffix = match.groups()
    if not NUMBER_RE.fullmatch(number):
        return 400, "unable to parse numeric part of quantity"
    if suffix not in SUFFIXES and not re.fullmatch(r"[eE][-+]?[0-9]+", suffix):
        return 400, "unable to parse quantity's suffix"
    if number.startswith("-") and float(number) != 0:
        return 422, "must be greater than or equal to 0"
    return None


def _containers(plural: str, obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    where = POD_TEMPLATE_KINDS.get(plural)
    found, pod = _lookup(obj, where) if where else (False, None)
    if not found or not isinstance(pod, Mapping):
        return
    prefix = ".".join(where or ())
    for group in ("initContainers", "containers"):
        for i, container in enumerate(pod.get(group) or []):
            yield f"{prefix}.{group}[{i}]", container


def check_quantities(plural: str, kind: str, obj: Mapping[str, Any]) -> None:
    """Raise the API server's error for the first bad quantity in the object's containers."""
    group_version = str(obj.get("apiVersion", "v1"))
    group = group_version.split("/")[0] if "/" in group_version else ""
    version = group_version.split("/")[-1]
    name = (obj.get("metadata") or {}).get("name", "")
    for where, container in _containers(plural, obj):
        for part in ("requests", "limits"):
            for resource, value in ((container.get("resources") or {}).get(part) or {}).items():
                problem = quantity_problem(value)
                if problem is None:
                    continue
                status, why = problem
                if status == 400:
                    raise KubernetesError(
                        status=400, reason="BadRequest",
                        message=f'{kind} in version "{version}" cannot be handled as a {kind}: '
                        f"{why}",
                    )  # fmt: skip
                field = f"{where}.resources.{part}.{resource}"
                kind_group = f"{kind}.{group}" if group else kind
                raise KubernetesError(
                    status=422, reason="Invalid",
                    message=f'{kind_group} "{name}" is invalid: {field}: Invalid value: '
                    f'"{value}": {why}',
                    details={"name": name, "group": group, "kind": kind,
                             "causes": [{"reason": "FieldValueInvalid", "field": field,
                                         "message": f'Invalid value: "{value}": {why}'}]},
                )  # fmt: skip
