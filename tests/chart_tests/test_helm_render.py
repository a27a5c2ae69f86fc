"""The chart lints, renders with default and non-default values, and renders valid Kubernetes."""

from __future__ import annotations

import pytest

VALUE_SETS = ["default", "custom", "storage-url"]


@pytest.mark.parametrize("value_set", ["default", "custom"])
def test_helm_lint_is_clean(run_helm, lib, value_set):
    _, values = lib.VALUE_SETS[value_set]
    proc = run_helm(
        "lint", str(lib.CHART), "--strict", "--namespace", lib.RELEASE_NAMESPACE, values=values
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    for level in ("[WARNING]", "[ERROR]"):
        assert level not in proc.stdout, proc.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_renders_the_expected_objects(render, value_set):
    kinds = sorted(d["kind"] for d in render(value_set))
    namespaced_roles = 2 if value_set == "custom" else 0
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
        ]
        + ["Role", "RoleBinding"] * namespaced_roles
    )


def _templated(docs):
    """Objects from templates/ (the CRD from crds/ has its own test below)."""
    return [d for d in docs if d["kind"] != "CustomResourceDefinition"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_objects_are_structurally_valid_kubernetes(render, k8s, value_set):
    """Unknown fields, wrong types and missing required fields, per the kubernetes client models."""
    problems = [p for doc in _templated(render(value_set)) for p in k8s.structural_errors(doc)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_objects_match_the_strict_kubernetes_json_schemas(render, k8s, value_set):
    """The official JSON schemas (strict: no unknown fields), as shipped by kubernetes-validate."""
    results = [k8s.strict_schema_errors(doc) for doc in _templated(render(value_set))]
    if any(r is None for r in results):
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    problems = [p for r in results for p in r or []]
    assert not problems, "\n".join(problems)


def test_crd_is_a_valid_apiextensions_v1_object(render, k8s, lib):
    """The API server decodes the CRD into apiextensions.k8s.io/v1 types before anything else:
    e.g. OpenAPI v3.0's exclusiveMinimum is a boolean beside minimum, not JSON Schema 2020's
    number, and a number there makes `helm install` fail on a real cluster."""
    crd = lib.one(render("default"), "CustomResourceDefinition")
    problems = k8s.structural_errors(crd)
    strict = k8s.strict_schema_errors(crd)
    problems += strict or []
    assert not problems, "\n".join(problems[:5]) + (
        f"\n... {len(problems) - 5} more" if len(problems) > 5 else ""
    )


def test_the_validator_catches_what_it_should(render, k8s, lib):
    """Guard against a validator that accepts everything."""
    import copy

    deployment = lib.one(render("default"), "Deployment")
    container_path = ("spec", "template", "spec", "containers")

    def mutated(change):
        doc = copy.deepcopy(deployment)
        node = doc
        for key in container_path:
            node = node[key]
        change(node[0], doc)
        return k8s.structural_errors(doc)

    assert mutated(lambda c, d: c.update(securityContex={}))  # misspelt field
    assert mutated(lambda c, d: c["ports"][0].update(containerPort="8080"))  # wrong type
    assert mutated(lambda c, d: c.pop("name"))  # required field
    assert mutated(lambda c, d: d["spec"].pop("selector"))  # required field
    assert mutated(lambda c, d: c.update(env={"A": "b"}))  # map where a list belongs
    assert not mutated(lambda c, d: None)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_has_the_standard_labels(render, lib, value_set):
    release, _ = lib.VALUE_SETS[value_set]
    for doc in render(value_set):
        if doc["kind"] == "CustomResourceDefinition":
            continue  # crds/ is copied verbatim, never templated
        labels = doc["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/name") == "infertune", doc["metadata"]
        assert labels.get("app.kubernetes.io/instance") == release
        assert labels.get("app.kubernetes.io/managed-by") == "Helm"
        assert labels.get("app.kubernetes.io/version") == "0.1.0"
        assert labels.get("app.kubernetes.io/part-of") == "infertune"
        assert labels.get("helm.sh/chart") == "infertune-0.1.0"
        assert labels.get("app.kubernetes.io/component") in ("operator", "tuner")


def test_namespaced_objects_live_in_the_release_namespace(render, lib):
    for doc in render("default"):
        if doc["kind"] in ("ServiceAccount", "Deployment"):
            assert doc["metadata"]["namespace"] == lib.RELEASE_NAMESPACE


def test_notes_say_what_to_apply_next(run_helm, lib):
    proc = run_helm(
        "install",
        "infertune",
        str(lib.CHART),
        "--namespace",
        lib.RELEASE_NAMESPACE,
        "--dry-run=client",
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -n default -f examples/llama3-70b-h100-simulated.yaml" in notes
    assert "kubectl get infd -n default -w" in notes
    assert "infertune report llama3-70b-sim -n default" in notes
    assert "kubectl apply -f charts/infertune/crds/" in notes
    assert "never upgrades" in notes


def test_notes_point_at_a_watched_namespace(run_helm, lib):
    proc = run_helm(
        "install",
        "tune",
        str(lib.CHART),
        "--namespace",
        lib.RELEASE_NAMESPACE,
        "--dry-run=client",
        values=lib.CUSTOM_VALUES,
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "namespaces team-a, team-b" in notes
    assert "kubectl get infd -n team-a -w" in notes
