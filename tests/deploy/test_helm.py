"""infra/helm/engram rendered by Helm's own template engine (helm-python-sdk binds the Helm v4
Go SDK; no helm binary), linted, every manifest validated against the Kubernetes JSON schemas
(kubernetes-validate, offline), and cross-checked against the code: commands, variables, probes."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from shared.runtime.quotas import QuotaSettings
from shared.security.nats_auth.keys import new_user_seed
from shared.security.nats_auth.permissions import GATEWAY
from tests.deploy.support import DEPLOYED, GATEWAY_ENV, INFRA, NEED_VECTOR_SERVER, REQUIRED_ENV, SETTINGS_ENV

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
    assert kinds == {"Deployment", "PodDisruptionBudget", "NetworkPolicy", "Secret", "Service"}


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
        if name == GATEWAY:
            continue  # its probes are on its HTTP port: the next test
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


def test_the_gateway_serves_http_behind_a_service_with_probes_on_its_port(docs: list[dict[str, Any]]) -> None:
    """`engram serve gateway`, 2 replicas, listening on all interfaces at its port, probed there,
    reached through a Service; the token keys (to verify bearers) but no database URL in its environment."""
    (deployment,) = [d for d in _of(docs, "Deployment") if d["metadata"]["name"].endswith("-gateway")]
    spec = deployment["spec"]
    container = spec["template"]["spec"]["containers"][0]
    assert container["args"] == ["serve", GATEWAY]
    assert spec["replicas"] == 2
    env = _env(deployment)
    assert not GATEWAY_ENV - set(env)
    assert "ENGRAM_DATABASE_URL" not in env
    assert env["ENGRAM_HTTP_HOST"] == "0.0.0.0"  # noqa: S104 (in a pod: reached through its Service)
    port = int(env["ENGRAM_HTTP_PORT"])
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    (service,) = _of(docs, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    without = render(_values(gateway={"enabled": False}))
    assert _of(without, "Deployment")
    assert not [d for d in without if d["metadata"]["name"].endswith("-gateway")]


def test_variables_are_read_by_the_code_and_none_required_is_missing(docs: list[dict[str, Any]]) -> None:
    """Every ENGRAM_* variable is a setting; each service has what serve needs; secrets come from
    the Secret under keys it holds; replicas of embed and recall share a Qdrant server."""
    secret = _of(docs, "Secret")[0]
    for deployment in _of(docs, "Deployment"):
        name = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        env = _env(deployment)
        assert set(env) <= SETTINGS_ENV, sorted(set(env) - SETTINGS_ENV)
        required = GATEWAY_ENV if name == GATEWAY else REQUIRED_ENV
        assert not required - set(env), (name, sorted(required - set(env)))
        if name != GATEWAY:
            assert env["ENGRAM_STREAM_REPLICAS"] == "3"
        assert env["ENGRAM_NATS_NKEY_SEED"]["secretKeyRef"]["key"] == f"nats-seed-{name}"
        for value in env.values():
            if isinstance(value, dict) and not value["secretKeyRef"].get("optional"):
                assert value["secretKeyRef"]["name"] == secret["metadata"]["name"]
                assert value["secretKeyRef"]["key"] in secret["stringData"], value
        if name in NEED_VECTOR_SERVER:
            assert env["ENGRAM_VECTOR_STORE"].startswith("http")


def test_disruption_budgets_and_network_policy_cover_every_service(docs: list[dict[str, Any]]) -> None:
    """A PDB per Deployment selecting its pods. The services' NetworkPolicy: no ingress, egress
    only to DNS and the dependencies' ports. The gateway's: ingress on its HTTP port only, egress
    to DNS and NATS only. Each pod is selected by exactly one of them."""
    deployments = _of(docs, "Deployment")
    pdbs = {
        tuple(sorted(p["spec"]["selector"]["matchLabels"].items())) for p in _of(docs, "PodDisruptionBudget")
    }
    for deployment in deployments:
        assert tuple(sorted(deployment["spec"]["selector"]["matchLabels"].items())) in pdbs
    policies = {p["metadata"]["name"].rsplit("-", 1)[-1]: p for p in _of(docs, "NetworkPolicy")}
    assert set(policies) == {"services", GATEWAY}

    def selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
        selector = policy["spec"]["podSelector"]
        if not selector["matchLabels"].items() <= labels.items():
            return False
        return all(labels.get(e["key"]) not in e["values"] for e in selector.get("matchExpressions", []))

    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        chosen = [name for name, policy in policies.items() if selects(policy, labels)]
        is_gateway = labels["app.kubernetes.io/component"] == GATEWAY
        assert chosen == [GATEWAY if is_gateway else "services"], (labels, chosen)
    services = policies["services"]["spec"]
    assert services["ingress"] == []
    assert {p["port"] for rule in services["egress"] for p in rule["ports"]} == {
        53,
        4222,
        5432,
        6333,
        6379,
        4318,
    }
    gateway = policies[GATEWAY]["spec"]
    assert [p["port"] for rule in gateway["ingress"] for p in rule["ports"]] == [8080]
    assert {p["port"] for rule in gateway["egress"] for p in rule["ports"]} == {53, 4222}


def test_missing_secrets_fail_the_render_and_an_existing_secret_is_used_as_named() -> None:
    """Without secrets the render stops with what to set; with existingSecret no Secret is made."""
    with pytest.raises(helm.HelmError, match=r"secrets\.tokenKeys"):
        render({})
    docs = render({"secrets": {"existingSecret": "engram-prod"}})
    assert _of(docs, "Secret") == []
    for deployment in _of(docs, "Deployment"):
        env = _env(deployment)
        assert env["ENGRAM_NATS_NKEY_SEED"]["secretKeyRef"]["name"] == "engram-prod"
        assert env["ENGRAM_TOKEN_KEYS"]["secretKeyRef"]["name"] == "engram-prod"


def test_tls_values_mount_the_ca_and_point_the_services_at_it() -> None:
    """nats.tls / postgres.tls secrets become mounted CA files named by the TLS settings."""
    docs = render(_values(nats={"tls": {"secretName": "nats-ca"}}, postgres={"tls": {"secretName": "pg-ca"}}))
    for deployment in _of(docs, "Deployment"):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
        env = _env(deployment)
        pod = deployment["spec"]["template"]["spec"]
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert env["ENGRAM_NATS_TLS_CA_FILE"].rsplit("/", 1)[0] in mounts
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        if deployment["metadata"]["name"].endswith("-gateway"):  # NATS only
            assert "ENGRAM_DATABASE_TLS_CA_FILE" not in env
            assert secrets == {"nats-ca"}
            continue
        assert env["ENGRAM_DATABASE_TLS_CA_FILE"].rsplit("/", 1)[0] in mounts
        assert secrets == {"nats-ca", "pg-ca"}


def test_quotas_reach_every_service_that_serves_requests_with_redis_to_share_them() -> None:
    """``quotas`` becomes ENGRAM_QUOTAS (settings the code accepts) wherever the edge or ingest
    charges a budget, each with Redis, so replicas spend one budget; none by default."""
    quotas = {"org": {"read": {"rate": 200, "burst": 400}, "sessions": {"rate": 20, "burst": 100}}}
    charged = {"ingest", "recall", "governance-audit"}
    for deployment in _of(render(_values(quotas=quotas)), "Deployment"):
        env = _env(deployment)
        service = deployment["metadata"]["name"].removeprefix("engram-")
        if service not in charged:
            continue
        assert QuotaSettings.model_validate_json(env["ENGRAM_QUOTAS"]).org_limit(uuid4(), "read")
        assert env["ENGRAM_REDIS_URL"]
        charged.remove(service)
    assert not charged, f"no deployment for {charged}"
    for deployment in _of(render(_values()), "Deployment"):
        assert "ENGRAM_QUOTAS" not in _env(deployment)
