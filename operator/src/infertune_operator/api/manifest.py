"""Read InferenceDeployment manifests (YAML or JSON, one or many documents) and validate them.

Validation reports *every* problem with its field path in one pass: pydantic's own errors for the
schema together with the catalog checks (known model, known GPU) that need the performance
model's data. The catalog checks read the raw document, so they run even when the schema fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infertune_operator.api.models import API_VERSION, KIND, InferenceDeployment
from infertune_tuner.errors import InputError


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def load_documents(path: Path) -> list[dict[str, Any]]:
    """All mapping documents in a YAML or JSON file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    try:
        if path.suffix == ".json":
            docs: list[Any] = [json.loads(text)]
        else:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not docs:
        raise InputError(f"{path}: the file holds no document")
    bad = [i for i, d in enumerate(docs) if not isinstance(d, dict)]
    if bad:
        raise InputError(f"{path}: document {bad[0] + 1} is not a mapping")
    return docs


def find_deployment_document(path: Path) -> dict[str, Any]:
    """The single InferenceDeployment document in a file (other kinds are skipped)."""
    docs = load_documents(path)
    ours = [d for d in docs if d.get("kind") == KIND]
    if not ours:
        if len(docs) == 1:
            return docs[0]  # validation will say what is wrong with kind/apiVersion
        raise InputError(f"{path}: no document of kind {KIND}")
    if len(ours) > 1:
        raise InputError(f"{path}: {len(ours)} {KIND} documents; give one per file")
    return ours[0]


def _field(doc: dict[str, Any], *path: str) -> Any:
    node: Any = doc
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def catalog_problems(doc: dict[str, Any]) -> list[Problem]:
    """Checks that need the tuner's catalogs: a known GPU, a known (or described) model, and a
    workload within the model's maximum context.

    Reads the raw document, so that a manifest with schema problems hears about these too; a
    field that is absent or not of its type is left to the schema's own problems.
    """
    from infertune_tuner.catalog.gpus import get_gpu
    from infertune_tuner.catalog.models import get_model

    problems = []
    product = _field(doc, "spec", "gpu", "product")
    if isinstance(product, str) and product:
        try:
            get_gpu(product)
        except InputError as exc:
            problems.append(Problem("spec.gpu.product", str(exc)))
    model = _field(doc, "spec", "model", "name")
    if isinstance(model, str) and model and _field(doc, "spec", "model", "architecture") is None:
        try:
            arch = get_model(model)
        except InputError as exc:
            problems.append(Problem("spec.model.name", str(exc)))
        else:
            isl = _field(doc, "spec", "workload", "inputTokens")
            osl = _field(doc, "spec", "workload", "outputTokens")
            if isinstance(isl, int) and isinstance(osl, int):
                too_long = arch.context_problem(isl, osl)
                if too_long is not None:
                    problems.append(Problem("spec.workload", too_long))
    return problems


def validate_document(doc: dict[str, Any]) -> tuple[InferenceDeployment | None, list[Problem]]:
    """Validate one manifest; returns the model (when valid) and every problem found."""
    problems: list[Problem] = []
    obj: InferenceDeployment | None = None
    try:
        obj = InferenceDeployment.model_validate(doc)
    except ValidationError as exc:
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            elif err["type"] == "literal_error" and _loc(err["loc"]) == "kind":
                msg = f"must be {KIND}"
            elif err["type"] == "literal_error" and _loc(err["loc"]) == "apiVersion":
                msg = f"must be {API_VERSION}"
            problems.append(Problem(_loc(err["loc"]), msg))
    problems.extend(catalog_problems(doc))
    return (obj if not problems else None), problems


def load_deployment(path: Path) -> InferenceDeployment:
    """Load and validate, raising InputError listing every problem."""
    obj, problems = validate_document(find_deployment_document(path))
    if obj is None:
        raise InputError(f"{path}: invalid {KIND}", [str(p) for p in problems])
    return obj
