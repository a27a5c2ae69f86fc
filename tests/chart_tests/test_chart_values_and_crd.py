"""values.schema.json rejects bad values; the chart's CRD never drifts from crds/."""

from __future__ import annotations

import json

import pytest
import yaml


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"tuner": {"defaultBackend": "gpu"}}, "defaultBackend"),
        ({"tuner": {"defaultMaxTrials": 0}}, "defaultMaxTrials"),
        ({"tuner": {"defaultMaxTrials": "forty"}}, "defaultMaxTrials"),
        ({"tuner": {"backoffLimit": -1}}, "backoffLimit"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"operator": {"tag": "has space"}}}, "tag"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"watchNamespaces": "team-a"}, "watchNamespaces"),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
        ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"tuner": {"defaultBackened": "simulated"}}, "defaultBackened"),
    ],
)
def test_schema_rejects_bad_values(run_helm, lib, values, complaint):
    proc = run_helm("template", "infertune", str(lib.CHART), values=values)
    assert proc.returncode != 0, f"accepted {values}"
    assert "schema" in proc.stderr and complaint in proc.stderr, proc.stderr


def test_set_flag_with_a_bad_backend_fails(run_helm, lib):
    proc = run_helm("template", "infertune", str(lib.CHART), "--set", "tuner.defaultBackend=gpu")
    assert proc.returncode != 0
    assert "defaultBackend" in proc.stderr


def test_storage_url_and_secret_are_exclusive(run_helm, lib):
    proc = run_helm(
        "template",
        "infertune",
        str(lib.CHART),
        values={"tuner": {"storage": {"url": "postgresql://db/optuna", "existingSecret": "db"}}},
    )
    assert proc.returncode != 0
    assert "either url or existingSecret" in proc.stderr


def test_schema_is_strict_everywhere(lib):
    """Every object in values.schema.json forbids unknown keys (except the free-form maps)."""
    schema = json.loads((lib.CHART / "values.schema.json").read_text())
    free_form = {
        "global",
        "affinity",
        "annotations",
        "podAnnotations",
        "podLabels",
        "nodeSelector",
        "requests",
        "limits",
        "tolerations",
    }

    def walk(node, name):
        if node.get("type") == "object" and name not in free_form:
            assert node.get("additionalProperties") is False, f"{name} is not strict"
        for key, child in (node.get("properties") or {}).items():
            walk(child, key)

    walk(schema, "<root>")


def test_values_yaml_keys_are_all_in_the_schema(lib):
    values = yaml.safe_load((lib.CHART / "values.yaml").read_text())
    schema = json.loads((lib.CHART / "values.schema.json").read_text())
    assert set(values) <= set(schema["properties"])
    assert set(schema["required"]) <= set(values)


def test_chart_crd_is_a_byte_copy_of_the_top_level_crd(lib):
    """Helm installs charts/infertune/crds/ verbatim; crds/ is what `infertune crd` generates.
    On drift: cp crds/inferencedeployments.infertune.io.yaml charts/infertune/crds/"""
    assert lib.CHART_CRD.read_bytes() == lib.TOP_LEVEL_CRD.read_bytes(), (
        "charts/infertune/crds/ drifted from crds/: "
        "cp crds/inferencedeployments.infertune.io.yaml charts/infertune/crds/"
    )
    assert sorted(p.name for p in (lib.CHART / "crds").iterdir()) == [lib.TOP_LEVEL_CRD.name]


def test_rendered_crd_is_the_file(render, lib):
    (crd,) = lib.find(render("default"), "CustomResourceDefinition")
    assert crd == yaml.safe_load(lib.TOP_LEVEL_CRD.read_text())
    assert crd["metadata"]["name"] == "inferencedeployments.infertune.io"


def test_chart_versions(lib):
    chart = yaml.safe_load((lib.CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == "0.1.0"
    assert chart["name"] == "infertune"


@pytest.mark.parametrize(
    "path",
    ["charts/infertune/README.md", "charts/infertune/templates/NOTES.txt", "docs/install.md"],
)
def test_docs_explain_the_crd_upgrade_path(lib, path):
    text = (lib.REPO_ROOT / path).read_text()
    assert "kubectl apply -f" in text and "crds/" in text
    assert "infertune crd | kubectl apply -f -" in text


FREE_FORM_VALUES = {
    "resources",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "tolerations",
    "affinity",
    "annotations",
    "imagePullSecrets",
    "watchNamespaces",
    "extraArgs",
}


def _leaf_keys(values, prefix=""):
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM_VALUES:
            yield from _leaf_keys(value, f"{path}.")
        else:
            yield path


def test_install_doc_lists_every_value(lib):
    values = yaml.safe_load((lib.CHART / "values.yaml").read_text())
    doc = (lib.REPO_ROOT / "docs" / "install.md").read_text()
    missing = [k for k in _leaf_keys(values) if f"`{k}`" not in doc]
    assert not missing, f"docs/install.md does not document {missing}"
