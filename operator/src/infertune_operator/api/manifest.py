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

from infertune_operator.api.types import API_VERSION, KIND, InferenceDeployment
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


MAX_DEPTH = 32  # an InferenceDeployment nests 6 levels; far deeper is not a manifest


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (the API
    server rejects it; PyYAML would silently keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                twice = key in seen
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if twice:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given at line "
                    f"{seen[key].start_mark.line + 1})", mark,
                )  # fmt: skip
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


MAX_NODES = 100_000  # values, aliases counted each time they are used (no YAML bombs)


def _shape_problem(doc: Any) -> str | None:
    """Why ``doc`` is no manifest by its shape alone: nested too deep, or too many values."""
    todo, count = [(doc, 1)], 0
    while todo:
        node, level = todo.pop()
        count += 1
        if level > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        if count > MAX_NODES:
            return f"more than {MAX_NODES} values (YAML aliases expand)"
        if isinstance(node, dict):
            todo.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, level + 1) for v in node)
    return None


def as_kubectl_sends(node: Any) -> Any:
    """The document as the API server receives it from ``kubectl apply``.

    kubectl turns YAML into JSON before sending it (sigs.k8s.io/yaml, then Go's encoding/json),
    and a number with an integral value comes out as an integer: ``inputTokens: 1024.0`` reaches
    the server as ``1024``. (Even sent as ``1024.0``, the server's OpenAPI validation accepts an
    integral float for an integer field.) So the CLI accepts exactly that, and nothing more:
    ``1024.5``, ``"1024"``, ``true``, ``.inf`` and ``.nan`` stay what they are and are refused.
    """
    if isinstance(node, float) and node.is_integer():  # finite, no fraction (bool is no float)
        return int(node)
    if isinstance(node, dict):
        return {k: as_kubectl_sends(v) for k, v in node.items()}
    if isinstance(node, list):
        return [as_kubectl_sends(v) for v in node]
    return node


def _parse(path: Path, text: str) -> list[Any]:
    if path.suffix == ".json":
        return [json.loads(text, object_pairs_hook=_no_duplicates)]
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]


def load_documents(path: Path) -> list[dict[str, Any]]:
    """All mapping documents in a YAML or JSON file (a key given twice is an error)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a manifest file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        docs = _parse(path, text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise InputError(f"{where}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:  # a duplicate key
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a manifest") from None
    for doc in docs:
        if (shape := _shape_problem(doc)) is not None:
            raise InputError(f"{path}: {shape}; not a manifest")
    if not docs:
        raise InputError(f"{path}: the file holds no document")
    bad = [i for i, d in enumerate(docs) if not isinstance(d, dict)]
    if bad:
        raise InputError(f"{path}: document {bad[0] + 1} is not a mapping")
    return [as_kubectl_sends(d) for d in docs]


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
    from infertune_tuner.catalog.llms import get_model

    problems = []
    products = [("spec.gpu.product", _field(doc, "spec", "gpu", "product"))]
    listed = _field(doc, "spec", "gpu", "pools")
    for i, pool in enumerate(listed if isinstance(listed, list) else []):
        products.append((f"spec.gpu.pools[{i}].product", _field(pool, "product")))
    for where, product in products:
        if isinstance(product, str) and product:
            try:
                get_gpu(product)
            except InputError as exc:
                problems.append(Problem(where, str(exc)))
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
        # As strict as the API server: no "1024" for a number, no true for 1, no snake_case keys.
        obj = InferenceDeployment.model_validate(doc, strict=True, by_alias=True, by_name=False)
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
