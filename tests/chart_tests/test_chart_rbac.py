"""RBAC: exactly the verbs and resources the operator and tuner Jobs use, never a wildcard."""

from __future__ import annotations

import pytest

ROLE_KINDS = ("ClusterRole", "Role")


@pytest.mark.parametrize("value_set", ["default", "custom", "storage-url"])
def test_no_wildcards_anywhere_in_rbac(render, value_set):
    for doc in render(value_set):
        if doc["kind"] not in ROLE_KINDS:
            continue
        assert doc.get("rules"), f"{doc['kind']} {doc['metadata']['name']} has no rules"
        assert "aggregationRule" not in doc
        for rule in doc["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                for item in rule.get(field) or []:
                    assert "*" not in item, f"{doc['metadata']['name']}: {field} has {item!r}"


def test_all_namespaces_gets_one_clusterrole_with_everything(render, lib):
    docs = render("default")
    operator_role = lib.one(docs, "ClusterRole", "infertune")
    assert lib.flatten_rules(operator_role) == lib.expected_rules(
        {**lib.NAMESPACED_RULES, **lib.CLUSTER_RULES}, bind_clusterrole="infertune-tuner"
    )
    binding = lib.one(docs, "ClusterRoleBinding", "infertune")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "infertune",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "infertune", "namespace": lib.RELEASE_NAMESPACE}
    ]
    assert lib.one(docs, "ServiceAccount")["metadata"]["name"] == "infertune"
    assert not lib.find(docs, "Role") and not lib.find(docs, "RoleBinding")


def test_watch_list_gets_a_role_per_namespace_and_only_cluster_reads_cluster_wide(render, lib):
    docs = render("custom")
    fullname = "tune-infertune"
    cluster_role = lib.one(docs, "ClusterRole", fullname)
    assert lib.flatten_rules(cluster_role) == lib.expected_rules(lib.CLUSTER_RULES)
    binding = lib.one(docs, "ClusterRoleBinding", fullname)
    assert binding["roleRef"]["name"] == fullname
    assert binding["subjects"][0]["namespace"] == lib.RELEASE_NAMESPACE

    roles = lib.find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["metadata"]["name"] == fullname
        assert lib.flatten_rules(role) == lib.expected_rules(
            lib.NAMESPACED_RULES, bind_clusterrole=f"{fullname}-tuner"
        )
    bindings = lib.find(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": fullname,
        }
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": fullname, "namespace": lib.RELEASE_NAMESPACE}
        ]


@pytest.mark.parametrize(
    ("value_set", "fullname"), [("default", "infertune"), ("custom", "tune-infertune")]
)
def test_tuner_clusterrole_is_minimal_and_is_what_the_operator_binds(
    render, lib, value_set, fullname
):
    docs = render(value_set)
    tuner_name = f"{fullname}-tuner"
    tuner_role = lib.one(docs, "ClusterRole", tuner_name)
    assert lib.flatten_rules(tuner_role) == lib.expected_rules(lib.TUNER_RULES)
    # The operator is told the name, and may bind that ClusterRole and no other.
    env = lib.env_of(lib.operator_container(docs))
    assert env["INFERTUNE_TUNER_CLUSTERROLE"]["value"] == tuner_name
    bind_rules = [
        rule
        for doc in docs
        if doc["kind"] in ROLE_KINDS
        for rule in doc["rules"]
        if "bind" in rule["verbs"]
    ]
    assert bind_rules
    for rule in bind_rules:
        assert rule["resources"] == ["clusterroles"] and rule["verbs"] == ["bind"]
        assert rule["resourceNames"] == [tuner_name]
    # No binding of the tuner role ships with the chart: the operator binds it per namespace.
    for doc in docs:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert doc["roleRef"]["name"] != tuner_name


def test_rbac_can_be_left_to_the_cluster_admin(run_helm, lib):
    import yaml

    proc = run_helm(
        "template",
        "infertune",
        str(lib.CHART),
        "--namespace",
        lib.RELEASE_NAMESPACE,
        values={"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "operator"}},
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert sorted(d["kind"] for d in docs) == ["Deployment"]
    assert docs[0]["spec"]["template"]["spec"]["serviceAccountName"] == "operator"
