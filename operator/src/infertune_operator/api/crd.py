"""Generate the InferenceDeployment CRD from the pydantic models.

Pydantic writes the JSON schema; this module only translates it into the *structural* OpenAPI v3
dialect Kubernetes requires (no ``$ref``, no ``anyOf`` with ``null``, ``nullable`` instead,
int-or-string quantities) and adds what JSON schema cannot say (CEL rules, printer columns).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from infertune_operator.api import formats
from infertune_operator.api.types import (
    GROUP,
    KIND,
    ONE_LATENCY_BOUND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
)
from infertune_tuner.metrics import LATENCY_METRICS, PERCENTILES

JsonSchema = dict[str, Any]

_ONE_PERCENTILE = {
    "rule": " || ".join(f"has(self.{p})" for p in PERCENTILES),
    "message": f"give at least one of {', '.join(PERCENTILES)}",
}

# CEL rules for what the schema alone can't say. Keyed by the property path below spec.
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "slo": [
        {
            "rule": " || ".join(f"has(self.{m.wire})" for m in LATENCY_METRICS),
            "message": ONE_LATENCY_BOUND,
        }
    ],
    **{f"slo.{m.wire}": [dict(_ONE_PERCENTILE)] for m in LATENCY_METRICS},
    "model.architecture": [
        {
            "rule": "self.heads % self.kvHeads == 0",
            "message": "heads must be a multiple of kvHeads",
        },
        {
            "rule": "has(self.headDim) || self.hiddenSize % self.heads == 0",
            "message": "hiddenSize must be a multiple of heads, or give headDim",
        },
        {
            "rule": "(has(self.expertsActive) ? self.expertsActive : 1) <= "
            "(has(self.experts) ? self.experts : 1)",
            "message": "expertsActive must not exceed experts",
        },
    ],
    "serving.observe": [
        {
            "rule": "!has(self.source) || self.source != 'prometheus' || has(self.prometheus)",
            "message": "source prometheus needs prometheus.url",
        }
    ],
    "": [
        {
            "rule": "!has(self.search) || !has(self.search.tensorParallel) || "
            "self.search.tensorParallel.exists(t, t <= "
            "(has(self.gpu.maxGpusPerReplica) ? self.gpu.maxGpusPerReplica : 8))",
            "message": "every search.tensorParallel value exceeds gpu.maxGpusPerReplica",
        }
    ],
}

# On the whole object: the name must make valid names for every object derived from it (a
# Service's name is a DNS-1035 label: no leading digit). The API server checks only DNS-1123.
ROOT_RULES: list[dict[str, str]] = [
    {
        "rule": f"size(self.metadata.name) <= {formats.NAME_MAX_LENGTH} && "
        f"self.metadata.name.matches('{formats.NAME_PATTERN}')",
        "message": f"metadata.name {formats.NAME_RULE}",
    }
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
    {"name": "GPU", "type": "string", "jsonPath": ".spec.gpu.product", "priority": 1},
    {"name": "TP", "type": "integer", "jsonPath": ".status.bestConfig.tp"},
    {"name": "Batch", "type": "integer", "jsonPath": ".status.bestConfig.maxBatchSize"},
    {"name": "Quant", "type": "string", "jsonPath": ".status.bestConfig.quantization"},
    {"name": "KV", "type": "string", "jsonPath": ".status.bestConfig.kvCacheDtype", "priority": 1},
    {
        "name": "Tok/s/GPU",
        "type": "number",
        "jsonPath": ".status.bestMetrics.outputTokensPerSecondPerGpu",
    },
    {"name": "SLO", "type": "boolean", "jsonPath": ".status.bestMetrics.sloMet"},
    # spec.gpu.pools: the pool it chose and what a million output tokens cost there.
    {"name": "Pool", "type": "string", "jsonPath": ".status.bestConfig.gpu", "priority": 1},
    {
        "name": "$/1M-tok",
        "type": "number",
        "jsonPath": ".status.bestMetrics.costPerMillionOutputTokens",
        "priority": 1,
    },
    # The load test after rollout: True, False (BelowTuned, SloMissed), Unknown while it runs.
    {
        "name": "Verified",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Verified")].status',
    },
    {
        "name": "Drifted",
        "type": "string",
        "priority": 1,
        "jsonPath": '.status.conditions[?(@.type=="WorkloadDrifted")].status',
    },
    {"name": "Trials", "type": "integer", "jsonPath": ".status.trials.executed", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP_KEYS = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, JsonSchema]) -> Any:
    """Inline $refs and rewrite every node into structural OpenAPI v3."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        if isinstance(extra.get("default"), dict):
            # The API server fills nested defaults into an empty object; a full dump would
            # carry nulls the structural schema rejects.
            extra["default"] = {}
        target.update(extra)
        return _resolve(target, defs)
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            merged: JsonSchema = {"x-kubernetes-int-or-string": True}
            # A string pattern (a quantity's) applies to the string form only.
            merged.update({k: o[k] for o in options for k in ("pattern",) if k in o})
        elif len(options) == 1:
            merged = _resolve(options[0], defs)
        else:
            raise ValueError(f"cannot express anyOf {options} structurally")
        node = {**merged, **{k: v for k, v in node.items() if k not in ("default",)}}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", 0) is None:
        node.pop("default")
    out: JsonSchema = {}
    for key, value in node.items():
        if key in _DROP_KEYS or (key == "additionalProperties" and value is False):
            # Structural schemas forbid additionalProperties: false; the API server prunes
            # unknown fields instead and `kubectl apply` (strict field validation) names them.
            continue
        if key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _resolve(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 writes the bound in exclusiveMinimum; OpenAPI v3 (Kubernetes)
            # wants minimum plus a boolean.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "propertyNames":
            # Kubernetes has no propertyNames; map keys are checked by CEL (see below).
            out["x-kubernetes-validations"] = [
                {
                    "rule": "self.all(k, k in " + _cel_list(value.get("enum", [])) + ")",
                    "message": "keys must be one of " + ", ".join(value.get("enum", [])),
                }
            ]
        else:
            out[key] = value
    if out.get("type") == "array" and out.get("items", {}).get("type") in ("string", "integer"):
        out["x-kubernetes-list-type"] = "set"
    return out


def _cel_list(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _attach_rules(spec_schema: JsonSchema) -> None:
    for path, rules in CEL_RULES.items():
        node = spec_schema
        for part in [p for p in path.split(".") if p]:
            node = node["properties"][part]
        node.setdefault("x-kubernetes-validations", []).extend(rules)


def openapi_schema() -> JsonSchema:
    """The structural schema of the whole object (apiVersion, kind, metadata, spec, status)."""
    spec_raw = InferenceDeploymentSpec.model_json_schema(by_alias=True)
    status_raw = InferenceDeploymentStatus.model_json_schema(by_alias=True)
    spec = _resolve(spec_raw, spec_raw.get("$defs", {}))
    status = _resolve(status_raw, status_raw.get("$defs", {}))
    spec.pop("description", None)
    status.pop("description", None)
    status.pop("additionalProperties", None)
    status["x-kubernetes-preserve-unknown-fields"] = True  # Kopf's own bookkeeping lives here
    _attach_rules(spec)
    return {
        "type": "object",
        "description": "An LLM served by Triton + TensorRT-LLM with an autotuned configuration.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


def crd() -> JsonSchema:
    """The CustomResourceDefinition object as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "infertune"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["infertune"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = "# Generated by `infertune crd` from the pydantic models. Do not edit by hand.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)
