"""The operator Deployment: shape, hardening, and the settings.py environment contract."""

from __future__ import annotations

import os

import pytest

from infertune_operator.settings import Settings

HEALTH_URL = "http://0.0.0.0:8080/healthz"


@pytest.mark.parametrize("value_set", ["default", "custom", "storage-url"])
def test_one_replica_recreated_never_rolled(render, lib, value_set):
    spec = lib.one(render(value_set), "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()


def test_args_watch_all_namespaces_by_default(render, lib):
    container = lib.operator_container(render("default"))
    assert "command" not in container  # the image's ENTRYPOINT is `infertune`
    assert container["args"] == ["operator", "--liveness", HEALTH_URL, "--all-namespaces"]


def test_args_name_each_watched_namespace(render, lib):
    container = lib.operator_container(render("custom"))
    assert container["args"] == [
        "operator",
        "--liveness",
        HEALTH_URL,
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
        "--verbose",
    ]
    assert "--all-namespaces" not in container["args"]


@pytest.mark.parametrize("value_set", ["default", "custom"])
def test_liveness_probe_hits_kopf_health_endpoint(render, lib, value_set):
    container = lib.operator_container(render(value_set))
    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": 8080}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]


@pytest.mark.parametrize("value_set", ["default", "custom", "storage-url"])
def test_operator_pod_is_hardened(render, lib, value_set):
    pod = lib.one(render(value_set), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == lib.OPERATOR_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = lib.operator_container(render(value_set))
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == lib.OPERATOR_UID
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc.get("privileged") in (None, False)
    # The only writable path is an emptyDir at /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp
    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert {"cpu", "memory"} <= resources["limits"].keys()


def test_env_names_are_exactly_those_settings_reads(render, lib):
    names = lib.settings_env_names()
    assert len(names) == 14, names  # settings.py is the contract; update both together
    for value_set in ("default", "custom", "storage-url"):
        env = lib.env_of(lib.operator_container(render(value_set)))
        assert set(env) <= names, set(env) - names
    storage = {
        "INFERTUNE_TUNER_STORAGE",
        "INFERTUNE_TUNER_STORAGE_SECRET",
        "INFERTUNE_TUNER_STORAGE_SECRET_KEY",
    }
    optional = {*storage, "INFERTUNE_MODEL_STORAGE_PVC"}
    assert set(lib.env_of(lib.operator_container(render("default")))) == names - optional
    # A Secret for the storage: its name reaches the operator, never the URL.
    custom = names - {"INFERTUNE_TUNER_STORAGE"}
    assert set(lib.env_of(lib.operator_container(render("custom")))) == custom


def _settings_from(
    env: dict[str, dict], monkeypatch: pytest.MonkeyPatch, secret: str = ""
) -> Settings:
    for name in list(os.environ):
        if name.startswith("INFERTUNE_"):
            monkeypatch.delenv(name)
    for name, var in env.items():
        monkeypatch.setenv(name, var.get("value", secret))  # valueFrom: the Secret's content
    return Settings.from_env()


def test_default_values_give_the_settings_defaults(render, lib, monkeypatch):
    env = lib.env_of(lib.operator_container(render("default")))
    settings = _settings_from(env, monkeypatch)
    expected = Settings()
    assert settings.operator_image == "infertune/operator:0.1.0"
    assert settings.tuner_image == "infertune/tuner:0.1.0"
    assert settings.triton_image == expected.triton_image
    assert settings.default_backend == expected.default_backend == "triton"
    assert settings.default_max_trials == expected.default_max_trials
    assert settings.job_backoff_limit == expected.job_backoff_limit
    assert settings.tuner_service_account == expected.tuner_service_account
    assert settings.tuner_clusterrole == expected.tuner_clusterrole == "infertune-tuner"
    assert settings.tuner_storage is None and settings.model_storage_pvc is None


def test_custom_values_reach_the_settings(render, lib, monkeypatch):
    container = lib.operator_container(render("custom"))
    env = lib.env_of(container)
    assert "INFERTUNE_TUNER_STORAGE" not in env  # the operator never holds the URL
    assert env["INFERTUNE_TUNER_STORAGE_SECRET"]["value"] == "optuna-db"
    assert env["INFERTUNE_TUNER_STORAGE_SECRET_KEY"]["value"] == "dsn"
    settings = _settings_from(env, monkeypatch)
    assert settings.operator_image == "registry.example.com/infertune/operator:0.1.0-rc1"
    assert container["image"] == settings.operator_image
    assert container["imagePullPolicy"] == "Always"
    assert settings.tuner_image == "registry.example.com/infertune/tuner:0.1.0-rc1"
    assert (
        settings.triton_image == "registry.example.com/nvidia/tritonserver:26.07-trtllm-python-py3"
    )
    assert settings.default_backend == "simulated"
    assert settings.default_max_trials == 12
    assert settings.job_backoff_limit == 0
    assert settings.tuner_service_account == "tuner-sa"
    assert settings.tuner_clusterrole == "tune-infertune-tuner"
    assert settings.tuner_storage is None
    assert (settings.tuner_storage_secret, settings.tuner_storage_secret_key) == (
        "optuna-db",
        "dsn",
    )
    assert settings.model_storage_pvc == "models"


def test_storage_url_is_passed_as_a_value(render, lib, monkeypatch):
    env = lib.env_of(lib.operator_container(render("storage-url")))
    url = lib.STORAGE_URL_VALUES["tuner"]["storage"]["url"]
    assert env["INFERTUNE_TUNER_STORAGE"] == {"name": "INFERTUNE_TUNER_STORAGE", "value": url}
    assert _settings_from(env, monkeypatch).tuner_storage == url


def test_pod_scheduling_and_metadata_values_are_applied(render, lib):
    deployment = lib.one(render("custom"), "Deployment")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    custom = lib.CUSTOM_VALUES
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == custom["nodeSelector"]
    assert pod["tolerations"] == custom["tolerations"]
    assert pod["affinity"] == custom["affinity"]
    assert template["metadata"]["annotations"] == custom["podAnnotations"]
    assert template["metadata"]["labels"]["team"] == "ml-platform"
    assert lib.operator_container(render("custom"))["resources"] == custom["resources"]
    sa = lib.one(render("custom"), "ServiceAccount")
    assert sa["metadata"]["annotations"] == custom["serviceAccount"]["annotations"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "tune-infertune"


def test_default_pod_has_no_empty_optional_fields(render, lib):
    pod = lib.one(render("default"), "Deployment")["spec"]["template"]["spec"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity"):
        assert key not in pod
