"""The report ConfigMap codec: how a tuning report lives on the cluster (pure).

The tuner Job writes it (``infertune tune-job``), the operator reads it to decide what to serve,
and ``infertune report`` fetches it for people. ``report.json`` in ``data``; a report too large
for that (ConfigMaps hold at most 1 MiB in total) goes gzipped into ``binaryData``.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from infertune_operator.api.models import API_VERSION, KIND
from infertune_operator.naming import (
    ANNOTATION_HASH,
    COMPONENT_REPORT,
    LABEL_HASH,
    Body,
    common_labels,
    owner_reference,
    report_configmap_name,
)
from infertune_tuner.result import Report

REPORT_KEY = "report.json"
REPORT_GZ_KEY = "report.json.gz"
REPORT_GZIP_THRESHOLD = 900 * 1024  # ConfigMaps hold at most 1 MiB in total
REPORT_MAX_BYTES = 1000 * 1024


def report_configmap(
    *,
    name: str,
    namespace: str,
    report_json: str,
    th: str | None,
    owner_uid: str | None,
) -> Body:
    """What the tuner Job writes: report.json, gzipped into binaryData when it is large.

    Args:
        name: The InferenceDeployment's name.
        namespace: Its namespace.
        report_json: The report (``Report.to_json()``).
        th: The tuning hash the report answers (labels and annotates the ConfigMap).
        owner_uid: The InferenceDeployment's uid: the ConfigMap is deleted with it.

    Returns:
        The ConfigMap. ValueError when even the gzipped report would not fit.
    """
    raw = report_json.encode("utf-8")
    labels = {**common_labels(name, COMPONENT_REPORT)}
    annotations: dict[str, str] = {}
    if th:
        labels[LABEL_HASH] = th
        annotations[ANNOTATION_HASH] = th
    body: Body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": report_configmap_name(name),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
    }
    if owner_uid:
        owner = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "uid": owner_uid},
        }
        # No blockOwnerDeletion: that would need inferencedeployments/finalizers rights.
        body["metadata"]["ownerReferences"] = [owner_reference(owner, block=False)]
    if len(raw) <= REPORT_GZIP_THRESHOLD:
        body["data"], body["binaryData"] = {REPORT_KEY: report_json}, None
        return body
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    if len(packed) * 4 / 3 > REPORT_MAX_BYTES:
        raise ValueError(
            f"the report is {len(raw)} bytes ({len(packed)} gzipped): too large for a ConfigMap"
        )
    body["data"] = None
    body["binaryData"] = {REPORT_GZ_KEY: base64.b64encode(packed).decode("ascii")}
    return body


def configmap_hash(cm: Mapping[str, Any] | None) -> str | None:
    """The tuning hash a report ConfigMap answers (None: no ConfigMap, or an unlabelled one)."""
    if not cm:
        return None
    meta = cm.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_HASH) or (meta.get("labels") or {}).get(
        LABEL_HASH
    )
    return str(value) if value else None


def report_text(cm: Mapping[str, Any]) -> str:
    """The report JSON from a report ConfigMap, plain or gzipped. ValueError if neither."""
    data = cm.get("data") or {}
    if REPORT_KEY in data:
        return str(data[REPORT_KEY])
    packed = (cm.get("binaryData") or {}).get(REPORT_GZ_KEY)
    if packed:
        try:
            return gzip.decompress(base64.b64decode(packed)).decode("utf-8")
        except (ValueError, OSError) as exc:
            raise ValueError(f"{REPORT_GZ_KEY} is not valid base64 gzip: {exc}") from None
    name = cm.get("metadata", {}).get("name", "?")
    raise ValueError(f"ConfigMap {name} holds neither {REPORT_KEY} nor {REPORT_GZ_KEY}")


def parse_report(cm: Mapping[str, Any]) -> Report:
    """ValueError (with the first problems) when the ConfigMap does not hold a valid report."""
    text = report_text(cm)
    try:
        return Report.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise ValueError(f"not a valid infertune report: {problems}") from None
