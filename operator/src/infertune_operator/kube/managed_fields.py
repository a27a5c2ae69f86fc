"""Handing the fields earlier versions wrote over to server-side apply (pure).

Server-side apply removes only the fields its own manager applied before
(https://kubernetes.io/docs/reference/using-api/server-side-apply/). Versions of the operator
before server-side apply created the serving objects with POST and changed them with JSON merge
patches: the API server recorded those fields under the kubernetes Python client's default
manager (the product of its User-Agent, ``OpenAPI-Generator``) with operation ``Update``. A key
such a version left behind (a dropped nodeSelector key) would stay forever.

:func:`adopt_legacy_fields` is the JSON patch that moves those fields to the ``infertune``
``Apply`` entry, as client-go's ``csaupgrade.UpgradeManagedFields`` does for kubectl: the next
apply then removes whatever the current render leaves out. It is guarded by a ``test`` of the
resourceVersion, so a write in between makes it fail instead of overwriting newer records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from infertune_operator.naming import ANNOTATION_RENDER_HASH, Body

# The field manager the API server derived for this operator's writes before it named one.
LEGACY_MANAGERS = frozenset({"OpenAPI-Generator"})


def _union(trees: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tree in trees:
        for key, sub in tree.items():
            out[key] = _union([out.get(key) or {}, sub or {}])
    return out


def adopt_legacy_fields(live: Mapping[str, Any], manager: str) -> list[Body] | None:
    """The JSON patch (RFC 6902) that hands the legacy manager's fields to ``manager``.

    Args:
        live: The object as read from the API server.
        manager: The apply field manager (``infertune``).

    Returns:
        None unless the object was written by this operator (it carries the render-hash
        annotation) through the legacy manager and has no ``Apply`` entry of ``manager`` yet.
    """
    meta = live.get("metadata") or {}
    if ANNOTATION_RENDER_HASH not in (meta.get("annotations") or {}):
        return None
    entries: list[Mapping[str, Any]] = list(meta.get("managedFields") or [])
    if any(e.get("manager") == manager and e.get("operation") == "Apply" for e in entries):
        return None
    legacy = [
        e
        for e in entries
        if e.get("manager") in LEGACY_MANAGERS
        and e.get("operation") == "Update"
        and not e.get("subresource")
    ]
    if not legacy:
        return None
    adopted: Body = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": live.get("apiVersion", ""),
        "fieldsType": "FieldsV1",
        "fieldsV1": _union(e.get("fieldsV1") or {} for e in legacy),
    }
    kept = [dict(e) for e in entries if not any(e is entry for entry in legacy)]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
        {"op": "replace", "path": "/metadata/managedFields", "value": [*kept, adopted]},
    ]
