"""The committed CRD is generated from the models; any drift fails."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from infertune_operator.api.crd import crd, crd_yaml
from infertune_operator.api.types import InferenceDeploymentSpec
from infertune_operator.cli import app

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "crds" / "inferencedeployments.infertune.io.yaml"


def test_committed_crd_equals_generated() -> None:
    assert COMMITTED.read_text() == crd_yaml(), (
        "crds/ drifted from the models: run `infertune crd > crds/inferencedeployments.infertune.io.yaml`"
        " and copy it to charts/infertune/crds/"
    )


def test_cli_prints_the_crd(cli: CliRunner) -> None:
    result = cli.invoke(app, ["crd"])
    assert result.exit_code == 0
    assert result.output == COMMITTED.read_text()


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    out = []
    for name, f in model.model_fields.items():
        alias = f.alias or name
        out.append((prefix + alias, model))
        for arg in (*getattr(f.annotation, "__args__", ()), f.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out.extend(_fields(arg, prefix + alias + "."))
    return out


def _lookup(schema: dict, dotted: str) -> dict | None:
    node = schema
    for part in dotted.split("."):
        node = node.get("items", node)
        props = node.get("properties", {})
        if part not in props:
            return None
        node = props[part]
    return node


def test_every_model_field_is_in_the_crd_schema() -> None:
    """A field added to the models changes the generated CRD (so the drift test catches it)."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    missing = [p for p, _ in _fields(InferenceDeploymentSpec) if _lookup(spec, p) is None]
    assert missing == []


def test_structural_schema_rules() -> None:
    text = crd_yaml()
    doc = yaml.safe_load(text)
    assert "$ref" not in text and "anyOf" not in text and "additionalProperties: false" not in text
    v = doc["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    cols = {c["name"] for c in v["additionalPrinterColumns"]}
    assert {"Phase", "TP", "Batch", "Quant", "Tok/s/GPU", "Age"} <= cols
    spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["slo"]["x-kubernetes-validations"]
    assert doc["spec"]["names"]["shortNames"] == ["infd"]
    tp = spec["properties"]["search"]["properties"]["tensorParallel"]
    assert tp["items"]["enum"] == [1, 2, 4, 8, 16, 32, 64]
    bound = spec["properties"]["slo"]["properties"]["ttftMs"]["properties"]["p95"]
    assert bound["minimum"] == 0 and bound["exclusiveMinimum"] is True
