"""Offline validation of rendered Kubernetes objects.

Two independent checks:

* ``structural_errors``: always available (the ``kubernetes`` client is a runtime dependency).
  Walks the object along the official client's model metadata (``openapi_types`` /
  ``attribute_map``, generated from the Kubernetes OpenAPI spec): unknown fields (a misspelt
  ``securityContex``), wrong JSON types (``containerPort: "8080"``) and non-objects where objects
  belong; then deserialises it into the model class (``V1Deployment`` ...), which enforces required
  fields (a container without ``name``).
* ``strict_schema_errors``: the Kubernetes JSON schemas (strict variant: no additional properties)
  shipped offline by the PyPI package ``kubernetes-validate``, checked with ``jsonschema``. Returns
  None when that package is not installed.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client
from kubernetes.client import ApiClient

KUBERNETES_VERSION = "1.35"  # the kube version helm 4.1 renders for by default

_LIST = re.compile(r"^(?:list|List)\[(.*)\]$")
_DICT = re.compile(r"^(?:dict\(|Dict\[)([^,]*), (.*)[)\]]$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    "bytearray": (str,),
}
# Quantities (resources.limits.cpu: 1) are int-or-string on the wire; the client types them as str.
_QUANTITY_MODELS = {"V1ResourceRequirements", "V1VolumeResourceRequirements"}


def model_name(doc: dict[str, Any]) -> str:
    """``apps/v1`` + ``Deployment`` -> ``V1Deployment``."""
    version = str(doc["apiVersion"]).split("/")[-1]
    return version[:1].upper() + version[1:] + str(doc["kind"])


def _walk(value: Any, type_name: str, path: str, errors: list[str], parent: str = "") -> None:
    if value is None:  # null is how YAML spells "absent"
        return
    if type_name.startswith("Optional["):
        type_name = type_name[len("Optional[") : -1]
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _walk(item, m.group(1), f"{path}[{i}]", errors, parent)
        return
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append(f"{path}: map key {key!r} is not a string")
            _walk(item, m.group(2), f"{path}.{key}", errors, parent)
        return
    if type_name == "object":
        return
    if type_name in _PRIMITIVES:
        allowed = _PRIMITIVES[type_name]
        if parent in _QUANTITY_MODELS and type_name == "str":
            allowed = (str, int, float)
        if isinstance(value, bool) and bool not in allowed:
            errors.append(f"{path}: expected {type_name}, got a boolean")
        elif not isinstance(value, allowed):
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    cls = getattr(kubernetes.client.models, type_name, None)
    if cls is None:
        errors.append(f"{path}: unknown model type {type_name}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
        return
    by_json_name = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        attr = by_json_name.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        _walk(item, cls.openapi_types[attr], f"{path}.{key}", errors, type_name)


def structural_errors(doc: dict[str, Any]) -> list[str]:
    """Problems found in one object by the kubernetes client's model metadata ([] when none)."""
    name = model_name(doc)
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    if getattr(kubernetes.client.models, name, None) is None:
        return [f"{where}: no kubernetes client model {name} (unknown apiVersion/kind?)"]
    errors: list[str] = []
    _walk(doc, name, where, errors)
    if errors:
        return errors
    try:  # required fields and the client's own value checks
        ApiClient()._ApiClient__deserialize(doc, name)  # type: ignore[attr-defined]
    except Exception as exc:
        errors.append(f"{where}: {name} rejects it: {exc}")
    return errors


def strict_schema_errors(doc: dict[str, Any]) -> list[str] | None:
    """Problems against the strict Kubernetes JSON schema, or None without kubernetes-validate."""
    try:
        import kubernetes_validate
    except ImportError:
        return None
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        path = ".".join(str(p) for p in getattr(exc, "absolute_path", ()))
        return [f"{where} at {path or '<root>'}: {getattr(exc, 'message', str(exc)[:500])}"]
    return []
