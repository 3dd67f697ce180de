"""infra/helm/engram rendered by Helm's own template engine (helm-python-sdk binds the Helm v4
Go SDK; no helm binary), linted, every manifest validated against the Kubernetes JSON schemas
(kubernetes-validate, offline), and cross-checked against the code: commands, variables, probes."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from shared.nats_auth.keys import new_user_seed
from tests.deploy.support import DEPLOYED, INFRA, NEED_VECTOR_SERVER, REQUIRED_ENV, SETTINGS_ENV

CHART = INFRA / "helm" / "engram"
#: The Kubernetes releases the manifests are validated for: an older one still widely run, and
#: the newest the validator knows.
KUBERNETES = "1.30"
NEWEST = kubernetes_validate.latest_version()


def _values(**extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "secrets": {
            "tokenKeys": "k1=" + "s" * 48,
            "databaseUrl": "postgresql://engram:pw@postgres:5432/engram",
            "natsSeeds": {name: new_user_seed() for name in DEPLOYED},
        }
    }
    values.update(extra)
    return values


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values=values, name="engram", namespace="memory")
    docs = []
    for path, text in out.items():
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(_values())


def test_the_chart_lints_clean() -> None:
    """helm lint --strict finds no error (only the advisory 'icon is recommended')."""
    result = helm.lint(str(CHART), _values(), strict=True)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []


def test_every_manifest_is_valid_kubernetes(docs: list[dict[str, Any]]) -> None:
    """Each rendered object validates against the published schema of its kind (strict: no
    unknown fields)."""
    kinds = set()
    for doc in docs:
        for version in (KUBERNETES, NEWEST):
            kubernetes_validate.validate(doc, version, strict=True)
        kinds.add(doc["kind"])
    assert kinds == {"Deployment", "PodDisruptionBudget", "NetworkPolicy", "Secret"}


def test_an_invalid_manifest_is_refused_by_the_validator(docs: list[dict[str, Any]]) -> None:
    """The validator is not a rubber stamp: a wrong type in a rendered Deployment fails."""
    broken = yaml.safe_load(yaml.safe_dump(_of(docs, "Deployment")[0]))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_a_deployment_per_service_runs_engram_serve_with_replicas_and_probes(
    docs: list[dict[str, Any]],
) -> None:
    """One Deployment per service: `engram serve <name>`, 2 replicas, probes on the health port."""
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in _of(docs, "Deployment")}
    assert set(deployments) == DEPLOYED
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        container = spec["template"]["spec"]["containers"][0]
        assert container["args"] == ["serve", name]
        assert spec["replicas"] == 2
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        env = _env(deployment)
        health = int(env["ENGRAM_HEALTH_PORT"])
        assert container["ports"] == [{"name": "health", "containerPort": health}]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        # The drain bound fits inside the grace period the pod is given.
        grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
        assert float(env["ENGRAM_SHUTDOWN_TIMEOUT_S"]) < grace
        assert container["resources"]["requests"]["cpu"]


def test_variables_are_read_by_the_code_and_none_required_is_missing(docs: list[dict[str, Any]]) -> None:
    """Every ENGRAM_* variable is a setting; each service has what serve needs; secrets come from
    the Secret under keys it holds; replicas of embed and recall share a Qdrant server."""
    secret = _of(docs, "Secret")[0]
    for deployment in _of(docs, "Deployment"):
        name = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        env = _env(deployment)
        assert set(env) <= SETTINGS_ENV, sorted(set(env) - SETTINGS_ENV)
        assert not REQUIRED_ENV - set(env), (name, sorted(REQUIRED_ENV - set(env)))
        assert env["ENGRAM_STREAM_REPLICAS"] == "3"
        assert env["ENGRAM_NATS_NKEY_SEED"]["secretKeyRef"]["key"] == f"nats-seed-{name}"
        for value in env.values():
            if isinstance(value, dict) and not value["secretKeyRef"].get("optional"):
                assert value["secretKeyRef"]["name"] == secret["metadata"]["name"]
                assert value["secretKeyRef"]["key"] in secret["stringData"], value
        if name in NEED_VECTOR_SERVER:
            assert env["ENGRAM_VECTOR_STORE"].startswith("http")


def test_disruption_budgets_and_network_policy_cover_every_service(docs: list[dict[str, Any]]) -> None:
    """A PDB per Deployment selecting its pods; one NetworkPolicy: no ingress, egress only to
    DNS and the dependencies' ports."""
    deployments = _of(docs, "Deployment")
    pdbs = {
        tuple(sorted(p["spec"]["selector"]["matchLabels"].items())) for p in _of(docs, "PodDisruptionBudget")
    }
    for deployment in deployments:
        assert tuple(sorted(deployment["spec"]["selector"]["matchLabels"].items())) in pdbs
    (policy,) = _of(docs, "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    assert policy["spec"]["ingress"] == []
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert ports == {53, 4222, 5432, 6333, 6379, 4318}


def test_missing_secrets_fail_the_render_and_an_existing_secret_is_used_as_named() -> None:
    """Without secrets the render stops with what to set; with existingSecret no Secret is made."""
    with pytest.raises(helm.HelmError, match=r"secrets\.tokenKeys"):
        render({})
    docs = render({"secrets": {"existingSecret": "engram-prod"}})
    assert _of(docs, "Secret") == []
    for deployment in _of(docs, "Deployment"):
        assert _env(deployment)["ENGRAM_TOKEN_KEYS"]["secretKeyRef"]["name"] == "engram-prod"


def test_tls_values_mount_the_ca_and_point_the_services_at_it() -> None:
    """nats.tls / postgres.tls secrets become mounted CA files named by the TLS settings."""
    docs = render(_values(nats={"tls": {"secretName": "nats-ca"}}, postgres={"tls": {"secretName": "pg-ca"}}))
    for deployment in _of(docs, "Deployment"):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
        env = _env(deployment)
        pod = deployment["spec"]["template"]["spec"]
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert env["ENGRAM_NATS_TLS_CA_FILE"].rsplit("/", 1)[0] in mounts
        assert env["ENGRAM_DATABASE_TLS_CA_FILE"].rsplit("/", 1)[0] in mounts
        assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {"nats-ca", "pg-ca"}
