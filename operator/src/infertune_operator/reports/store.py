"""The report ConfigMap codec: how a tuning report lives on the cluster (pure).

The tuner Job writes it (``infertune tune-job``), the operator reads it to decide what to serve,
and ``infertune report`` fetches it for people. The API server refuses a ConfigMap whose
``data`` and ``binaryData`` values exceed 1 MiB together (1,048,576 bytes; binaryData counted
decoded), so what is stored is bounded by construction, within :data:`REPORT_BUDGET`:

* a report whose JSON fits is stored whole: ``data["report.json"]``;
* a larger one gzipped, when that fits: ``binaryData["report.json.gz"]`` (JSON of reports
  compresses about 14-fold: the largest study the CRD allows, 7.8 MB, takes 0.55 MB);
* else its summary, in ``data["report.json"]`` (``summary``: the executed trials, each
  capped; never over the budget). The study storage keeps every trial (``spec.tuning.storage``);
* the annotation ``infertune.io/report-trials`` counts the complete report's trials, so the
  status says how many configurations were considered even when only the summary is stored;
  ``infertune.io/report-summary: "true"`` marks a summary.

Readers take ``report.json.gz`` when it is there, else ``report.json`` (the whole report or its
summary); what earlier versions wrote (indented JSON, plain or gzipped) reads the same way.
Decompression is bounded by :data:`REPORT_JSON_LIMIT`, the largest report JSON infertune stores
gzipped: anyone who may write ConfigMaps in a namespace can label one as a report, and a 1 MiB
gzip bomb would otherwise expand to about a gigabyte inside the operator (and crash-loop it).
"""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from infertune_operator.api.types import API_VERSION, KIND
from infertune_operator.naming import (
    ANNOTATION_HASH,
    ANNOTATION_REPORT_SUMMARY,
    ANNOTATION_REPORT_TRIALS,
    ANNOTATION_TUNER_JOB,
    COMPONENT_REPORT,
    LABEL_HASH,
    Body,
    common_labels,
    owner_reference,
    report_configmap_name,
)
from infertune_operator.reports.summary import compact, size, summarize
from infertune_tuner.result import Report

REPORT_KEY = "report.json"
REPORT_GZ_KEY = "report.json.gz"
# The API server's limit on a ConfigMap's data + binaryData (MaxSecretSize, 1 MiB; validation of
# ConfigMaps in k8s.io/kubernetes pkg/apis/core/validation), less room for what else the object
# carries in etcd (metadata, managed fields).
CONFIGMAP_LIMIT = 1024 * 1024
REPORT_BUDGET = 1_000_000
# The largest report JSON stored gzipped (a larger one is stored as its summary), and so the most
# a reader decompresses. The largest study the CRD allows (1000 trials over 4480 configurations,
# tests/operator_tests/largest_study.py) is 7.8 MB of JSON: twice that leaves room for longer
# failure reasons; deflate's worst case, 1032:1, would turn 1 MiB into a gigabyte.
REPORT_JSON_LIMIT = 16 * 1024 * 1024


def report_configmap(
    *,
    name: str,
    namespace: str,
    report: Report,
    th: str | None,
    owner_uid: str | None,
    job_uid: str | None = None,
) -> Body:
    """What the tuner Job writes: the report, or its summary and the complete one gzipped.

    Args:
        name: The InferenceDeployment's name.
        namespace: Its namespace.
        report: The report.
        th: The tuning hash the report answers (labels and annotates the ConfigMap).
        owner_uid: The InferenceDeployment's uid: the ConfigMap is deleted with it.
        job_uid: The uid of the tuner Job whose pod writes it (annotated, when known).

    Returns:
        The ConfigMap; its data and binaryData never exceed :data:`REPORT_BUDGET` bytes.
    """
    labels = {**common_labels(name, COMPONENT_REPORT)}
    annotations: dict[str, str] = {ANNOTATION_REPORT_TRIALS: str(len(report.trials))}
    if th:
        labels[LABEL_HASH] = th
        annotations[ANNOTATION_HASH] = th
    if job_uid:
        annotations[ANNOTATION_TUNER_JOB] = job_uid
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
    body["data"], body["binaryData"], complete = stored_values(report)
    if not complete:
        annotations[ANNOTATION_REPORT_SUMMARY] = "true"
    return body


def stored_values(
    report: Report,
) -> tuple[dict[str, str] | None, dict[str, str] | None, bool]:
    """(data, binaryData, whether that is the complete report) of the report ConfigMap;
    together at most :data:`REPORT_BUDGET` bytes, binaryData counted decoded as the API server
    counts it.

    The complete report, plain when it fits, else gzipped when that fits; else its summary
    (``summary``), which always fits.
    """
    whole = compact(report.model_dump(mode="json", by_alias=True))
    if size(whole) <= REPORT_BUDGET:
        return {REPORT_KEY: whole}, None, True
    packed = gzip.compress(whole.encode("utf-8"), compresslevel=9, mtime=0)
    if len(packed) <= REPORT_BUDGET and size(whole) <= REPORT_JSON_LIMIT:
        return None, {REPORT_GZ_KEY: base64.b64encode(packed).decode("ascii")}, True
    return {REPORT_KEY: summarize(report, REPORT_BUDGET)}, None, False


def stored_bytes(cm: Mapping[str, Any]) -> int:
    """What the API server counts against a ConfigMap's 1 MiB: data values (UTF-8) and
    binaryData values (decoded)."""
    total = sum(size(str(v)) for v in (cm.get("data") or {}).values())
    for value in (cm.get("binaryData") or {}).values():
        total += len(base64.b64decode(value))
    return total


def is_complete(cm: Mapping[str, Any]) -> bool:
    """Whether the ConfigMap holds the complete report, not only its summary."""
    meta = cm.get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANNOTATION_REPORT_SUMMARY) != "true"


def trials_total(cm: Mapping[str, Any], report: Report) -> int:
    """How many trials the complete report lists (the annotation; else the report's own)."""
    meta = cm.get("metadata") or {}
    try:
        return int((meta.get("annotations") or {}).get(ANNOTATION_REPORT_TRIALS, ""))
    except ValueError:
        return len(report.trials)


def configmap_hash(cm: Mapping[str, Any] | None) -> str | None:
    """The tuning hash a report ConfigMap answers (None: no ConfigMap, or an unlabelled one)."""
    if not cm:
        return None
    meta = cm.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ANNOTATION_HASH) or (meta.get("labels") or {}).get(
        LABEL_HASH
    )
    return str(value) if value else None


def writer_job_uid(cm: Mapping[str, Any] | None) -> str | None:
    """The uid of the tuner Job whose pod wrote a report (None: not recorded)."""
    meta = (cm or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANNOTATION_TUNER_JOB) or None


def report_text(cm: Mapping[str, Any]) -> str:
    """The report JSON from a report ConfigMap: the complete one (gzipped) when it is there, else
    ``report.json``. ValueError if neither."""
    data = cm.get("data") or {}
    packed = (cm.get("binaryData") or {}).get(REPORT_GZ_KEY)
    if not packed and REPORT_KEY in data:
        return str(data[REPORT_KEY])
    if packed:
        return _gunzip_bounded(str(packed))
    name = cm.get("metadata", {}).get("name", "?")
    raise ValueError(f"ConfigMap {name} holds neither {REPORT_KEY} nor {REPORT_GZ_KEY}")


def _gunzip_bounded(packed: str, limit: int = REPORT_JSON_LIMIT) -> str:
    """The text of a base64 gzip value, refused (ValueError) once it expands past ``limit``
    bytes. Inflated a chunk at a time: a bomb costs at most ``limit`` bytes before it is
    refused, not what it would expand to."""
    chunk = 1024 * 1024
    try:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
        pending = base64.b64decode(packed)
        parts: list[bytes] = []
        held = 0
        while pending and not inflater.eof:
            part = inflater.decompress(pending, chunk)
            pending = inflater.unconsumed_tail
            parts.append(part)
            held += len(part)
            if held > limit:
                raise OverflowError
        if not inflater.eof:
            parts.append(inflater.flush())
    except OverflowError:
        raise ValueError(
            f"{REPORT_GZ_KEY} expands past {limit // (1024 * 1024)} MiB, more than any report "
            "infertune writes (a compression bomb?): refused unread"
        ) from None
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"{REPORT_GZ_KEY} is not valid base64 gzip: {exc}") from None
    if not inflater.eof:
        raise ValueError(f"{REPORT_GZ_KEY} is not valid base64 gzip: the gzip stream is truncated")
    try:
        return b"".join(parts).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{REPORT_GZ_KEY} is not UTF-8 JSON: {exc}") from None


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
