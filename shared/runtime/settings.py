"""Settings, read once at the composition root (``ENGRAM_*`` environment variables or a
``.env`` file) and passed down. Domain code never reads the environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.runtime.quotas import QuotaSettings

__all__ = ["EngramSettings", "OidcIssuerSettings"]


class OidcIssuerSettings(BaseModel):
    """One OpenID Connect issuer whose tokens Engram accepts (docs/adr/0093-oidc-tokens.md):
    an element of ``ENGRAM_OIDC_ISSUERS``, or the ``ENGRAM_OIDC_*`` variables of one more."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The ``iss`` its tokens carry; its keys come by discovery under it unless ``jwks_url``.
    issuer: str = Field(min_length=1)
    #: The ``aud`` of its tokens meant for Engram: required, or any token it issues would do.
    audience: str = Field(min_length=1)
    #: The organizations it may name, or ``"*"`` (written out: an operator's decision).
    orgs: Literal["*"] | tuple[UUID, ...]
    jwks_url: str = ""
    org_claim: str = Field(default="org_id", min_length=1)
    principal_claim: str = Field(default="sub", min_length=1)
    principal_kind_claim: str = Field(default="principal_kind", min_length=1)
    permissions_claim: str = Field(default="scope", min_length=1)
    agent_config_claim: str = Field(default="agent_config_id", min_length=1)
    leeway_s: float = Field(default=30.0, ge=0, le=300)
    keys_ttl_s: float = Field(default=300.0, gt=0)
    refresh_min_s: float = Field(default=10.0, ge=0)
    fetch_timeout_s: float = Field(default=3.0, gt=0, le=30)

    def may_name(self, org_id: UUID) -> bool:
        return self.orgs == "*" or org_id in self.orgs


class EngramSettings(BaseSettings):
    """Everything a service or the embedded stack needs to know about its surroundings."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", env_file=".env", extra="ignore")

    # Each field's description is its line in docs/configuration.md and the README's table
    # (``python -m services.config_reference``, ``make schema``): say what it means, in one place.

    # -- NATS ----------------------------------------------------------------------------------
    nats_url: str = Field(
        default="",
        description="External NATS; empty: `engram up` starts its own. A cluster takes a comma-separated "
        "seed list (`nats://n1:4222,nats://n2:4222,nats://n3:4222`): the client learns the other nodes "
        "and fails over between them.",
    )
    nats_tls_ca_file: str = Field(
        default="",
        description="TLS to NATS (off-box traffic is encrypted, SPEC 8): a CA file turns TLS on and "
        "verifies the servers with it.",
    )
    nats_tls_cert_file: str = Field(
        default="", description="TLS to NATS: a client certificate, sent when the servers ask for one."
    )
    nats_tls_key_file: str = Field(default="", description="TLS to NATS: the client certificate's key.")
    nats_nkey_seed: SecretStr = Field(
        default=SecretStr(""),
        description="This process's NATS identity on an external server: a user nkey seed (`SU…`; "
        "`engram credentials keygen --out FILE` makes one, infra/nats/engram-auth.conf names the users). "
        "Empty connects without one; `engram up` sets a fresh key of its own at every start.",
    )
    gateway_nkey_seed: SecretStr = Field(
        default=SecretStr(""),
        description="The HTTP gateway's NATS identity when it differs from the services' (`engram up` "
        "makes one per run; `engram serve gateway` uses `ENGRAM_NATS_NKEY_SEED`, its process's own).",
    )

    # -- Postgres and Redis --------------------------------------------------------------------
    database_url: str = Field(
        default="",
        description="External Postgres (`postgresql://…`); empty: `engram up` starts its own.",
    )
    database_tls_ca_file: str = Field(
        default="",
        description="TLS to Postgres: a CA file verifies the server and its host name (`?ssl=require` "
        "in the URL also works, without verifying).",
    )
    database_tls_cert_file: str = Field(
        default="", description="TLS to Postgres: a client certificate, sent when given."
    )
    database_tls_key_file: str = Field(
        default="", description="TLS to Postgres: the client certificate's key."
    )
    redis_url: str = Field(
        default="",
        description="Redis, optional: the shared cue-vector and hot-result caches "
        "(docs/adr/0041-result-cache.md).",
    )
    data_dir: Path = Field(
        default=Path(".engram"),
        description="`engram up`'s embedded NATS and Postgres data, credentials and `connection.json`, "
        "and the Qdrant Edge store (`vectors/`).",
    )
    purge_ledger: str = Field(
        default="",
        description="The purge ledger: every purge's and delete's tombstone, appended (JSON Lines, "
        "ids and scopes, no text) so that `engram restore` of an older backup erases it again. Keep "
        "it on storage that outlives the database and its backups. Empty: "
        "`<data_dir>/purge-ledger.jsonl` (docs/adr/0085-backup-restore-purge-ledger.md).",
    )

    # -- Tokens --------------------------------------------------------------------------------
    token_keys: SecretStr = Field(
        default=SecretStr(""),
        description="Token signing keys, `kid=secret` pairs separated by commas (secrets of 32+ "
        "characters); the first signs, all verify. Empty in `engram up`: a development key generated "
        "into the data dir.",
    )
    token_issuer: str = Field(
        default="engram",
        description="The issuer (`iss`) tokens are minted with and must carry.",
    )
    # Tokens from OpenID Connect issuers (docs/adr/0093-oidc-tokens.md); read by oidc_issuer_list().
    oidc_issuers: Annotated[tuple[OidcIssuerSettings, ...], NoDecode] = Field(
        default=(),
        description="Tokens from OpenID Connect issuers beside Engram's own (SPEC 8): a JSON list of "
        '`{"issuer", "audience", "orgs": [...] or "*"}` with optional `jwks_url`, claim names, '
        "`leeway_s`, `keys_ttl_s`, `refresh_min_s`, `fetch_timeout_s` (`shared/runtime/settings.py: "
        'OidcIssuerSettings`; README, "Tokens from your identity provider"). Empty: none.',
    )
    oidc_issuer: str = Field(
        default="",
        description="One more OpenID Connect issuer without JSON: its `iss`; its keys come through "
        "`<issuer>/.well-known/openid-configuration` (or `ENGRAM_OIDC_JWKS_URL`). Needs "
        "`ENGRAM_OIDC_AUDIENCE` and `ENGRAM_OIDC_ORGS`.",
    )
    oidc_audience: str = Field(
        default="", description="The `aud` of `ENGRAM_OIDC_ISSUER`'s tokens meant for Engram."
    )
    oidc_orgs: str = Field(
        default="",
        description="The organizations `ENGRAM_OIDC_ISSUER` may name: `*`, or their ids separated by "
        "commas; a token naming another is refused.",
    )
    oidc_jwks_url: str = Field(
        default="",
        description="Where `ENGRAM_OIDC_ISSUER` publishes its keys (empty: by discovery).",
    )
    oidc_org_claim: str = Field(
        default="", description="The claim naming the organization (empty: `org_id`)."
    )
    oidc_principal_claim: str = Field(
        default="", description="The claim naming the principal's id (empty: `sub`)."
    )
    oidc_principal_kind_claim: str = Field(
        default="",
        description="The claim naming the principal's kind (empty: `principal_kind`; `service` when a "
        "token has none).",
    )
    oidc_permissions_claim: str = Field(
        default="",
        description="The claim listing the permissions, space-separated or a list (empty: `scope`, "
        "then `scp`); only Engram's permission names count.",
    )

    # -- Fair share between tenants -------------------------------------------------------------
    quotas: QuotaSettings = Field(
        default_factory=QuotaSettings,
        description="Budgets per organization and per token (SPEC 11; docs/adr/0084-quotas.md), JSON: "
        '`{"org": {"read": {"rate": 200, "burst": 400}, "write": …, "governance": …, "sessions": …}, '
        '"token": {…}, "orgs": {"<org id>": {…}}}` — requests a second and burst per operation class; '
        "a class left out is not limited. Over budget: `RATE_LIMITED` (HTTP 429 with `Retry-After`); a "
        "session is dead-lettered. Shared by replicas through `ENGRAM_REDIS_URL`. Empty: no limits.",
    )
    edge_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Requests of one operation a service answers at once; one organization holds at most "
        "half of them (at least one), so another's request never waits behind its backlog "
        "(docs/adr/0100-fair-share.md).",
    )
    edge_org_queue: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Requests of one organization that may wait for one operation in a service; more are "
        "answered `RATE_LIMITED` (retry after 1 s) instead of queued.",
    )

    # -- distill -------------------------------------------------------------------------------
    distill_model_url: str = Field(
        default="",
        description="An OpenAI-compatible `/v1` endpoint for distill (LiteLLM, vLLM, Ollama, OpenAI); "
        "empty: the deterministic built-in distiller.",
    )
    distill_model: str = Field(
        default="gpt-4o-mini", description="The model distill asks at `ENGRAM_DISTILL_MODEL_URL`."
    )
    distill_api_key: SecretStr = Field(
        default=SecretStr(""), description="The API key sent to `ENGRAM_DISTILL_MODEL_URL`."
    )
    distill_timeout_s: float = Field(
        default=20.0, gt=0, description="Seconds one attempt of a distill model call may take."
    )
    distill_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Further attempts of a distill model call that timed out, failed to connect or "
        "got a 429 or 5xx.",
    )

    # -- Streams and consumers -----------------------------------------------------------------
    session_retention_s: int = Field(
        default=24 * 3600,
        ge=600,
        description="How long raw sessions (and their tokens, in headers) may wait in `ENGRAM_SESSIONS`: "
        "long enough to ride out an outage of the services, short because traces hold raw text.",
    )
    dead_letter_retention_s: int = Field(
        default=7 * 24 * 3600,
        ge=3600,
        description="How long dead letters stay in `ENGRAM_DLQ` for an operator to inspect and replay.",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of every Engram stream: 1 on one server, 3 on a 3-node cluster, so that "
        "losing a node loses no acknowledged message.",
    )
    max_deliver: int = Field(
        default=5,
        ge=1,
        description="Deliveries of a message that fails on its own before it is dead-lettered (an "
        "outage is retried without limit; docs/adr/0007-consumer-failures.md).",
    )
    redeliver_backoff_s: tuple[float, ...] = Field(
        default=(1.0, 5.0, 15.0, 30.0),
        description="Seconds before a failed message comes back, by delivery (a JSON list; the last "
        "step repeats).",
    )
    ack_wait_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds until what a crashed worker held un-acked goes to another; a live worker "
        "keeps its messages with in-progress heartbeats (docs/adr/0006-ack-wait-and-heartbeats.md).",
    )

    # -- Processes: health, HTTP, shutdown -----------------------------------------------------
    health_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="`engram serve`'s `/healthz`, `/readyz` and `/metrics`; off (0) unless set, since "
        "several processes on one host would collide on a fixed port (`infra/` sets 8081).",
    )
    health_host: str = Field(
        default="0.0.0.0",  # noqa: S104 (a container's probes reach it from outside)
        description="Where the health port listens: every interface, as a container's probes come "
        "from outside.",
    )
    http_port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="The HTTP gateway (`engram serve gateway`, and `engram up`, which takes a free "
        "port when this one is taken); 0 always takes a free one.",
    )
    http_host: str = Field(
        default="127.0.0.1",
        description="Where the HTTP gateway listens: loopback by default, `0.0.0.0` in a container.",
    )
    http_cors_origins: str = Field(
        default="",
        description="Browser origins allowed to call the gateway (CORS), comma-separated; empty sends "
        "no CORS headers, so browsers on other origins cannot read replies.",
    )
    http_request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds the gateway waits for a service's reply when the operation names no timeout; "
        "the services leave a request that has waited longer than this in their queue (no one waits for it).",
    )
    shutdown_timeout_s: float = Field(
        default=25.0,
        gt=0,
        description="After SIGTERM: stop fetching, finish and ack in-flight work, flush the outbox and "
        "exit 0 within this many seconds (under Kubernetes' default 30 s grace), else exit 1.",
    )

    # -- Embedding and recall ------------------------------------------------------------------
    embedder: str = Field(
        default="all-MiniLM-L6-v2",
        description="`all-MiniLM-L6-v2` (in-process, onnxruntime, from the packaged weights), "
        "`hashing-384` (lexical feature hashing, not semantic; for tests that need speed), or a model "
        "served at `ENGRAM_EMBEDDER_URL`. After a change run `engram reindex`; until then semantic "
        "replies carry the warning `semantic_index_incomplete` (docs/adr/0046-changing-the-embedder.md).",
    )
    embedder_url: str = Field(
        default="",
        description="Any OpenAI-compatible `/v1/embeddings` endpoint serving `ENGRAM_EMBEDDER`.",
    )
    embedder_api_key: SecretStr = Field(
        default=SecretStr(""), description="The API key sent to `ENGRAM_EMBEDDER_URL`."
    )
    embedder_dimension: int = Field(
        default=384,
        ge=8,
        le=8192,
        description="The size of the vectors the model at `ENGRAM_EMBEDDER_URL` returns.",
    )
    vector_store: str = Field(
        default="",
        description="Empty: Qdrant Edge in-process under the data dir (one process only); a Qdrant "
        "server URL; or `none` (semantic recall answers `VECTOR_UNAVAILABLE`). It holds hybrid's lexical "
        "index too: a store made without it is refused — give it a new directory or collection and run "
        "`engram reindex`.",
    )
    config_cache_s: float = Field(
        default=1.0,
        ge=0,
        description="Seconds recall trusts a memory config it read: a config change takes effect within it.",
    )
    result_cache_s: int = Field(
        default=30,
        ge=0,
        description="Seconds a hot recall reply may live in Redis (`ENGRAM_REDIS_URL`); 0 turns the "
        "cache off. Writes and erasures invalidate earlier; this bounds what an invalidation could not "
        "reach.",
    )
    retention_sweep_s: float = Field(
        default=30.0,
        gt=0,
        description="How often governance erases expired entries (recall hides them the moment they expire).",
    )
    page_token_ttl_s: int = Field(
        default=3600, ge=60, description="Seconds a list or export page token stays valid."
    )
    webhook_attempts: int = Field(
        default=8,
        ge=1,
        le=100,
        description="Attempts to deliver one event to a webhook before it is dead-lettered "
        "(engram.dlq.webhook; replay with POST /v1/webhooks/{id}/replay).",
    )
    webhook_backoff_s: tuple[float, ...] = Field(
        default=(5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0),
        description="Seconds before a webhook delivery is tried again, by failed attempt (a JSON "
        "list; the last step repeats).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=60, description="Seconds a webhook receiver has to answer one delivery."
    )
    webhook_allow_private_networks: bool = Field(
        default=False,
        description="Let webhooks point at loopback, private, link-local and other non-public "
        "addresses (tests, a receiver on the same private network). Off: such URLs are refused at "
        "registration and at every delivery, so a tenant cannot reach the deployment's internals.",
    )

    # -- Telemetry and logs --------------------------------------------------------------------
    otel_exporter: str = Field(
        default="none",
        description="OpenTelemetry traces: `console` (local), `otlp` (to `ENGRAM_OTEL_ENDPOINT`) or "
        "`none` (trace context is still carried across services).",
    )
    otel_endpoint: str = Field(default="", description="The OTLP endpoint for `ENGRAM_OTEL_EXPORTER=otlp`.")
    log_level: str = Field(default="INFO", description="`DEBUG`, `INFO`, `WARNING` or `ERROR`.")
    log_json: bool = Field(default=False, description="`true` for JSON log lines.")

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of the setting ``name`` (``ack_wait_s`` → ``ENGRAM_ACK_WAIT_S``)."""
        return f"{cls.model_config.get('env_prefix', '')}{name}".upper()

    @field_validator("otel_exporter")
    @classmethod
    def _known_exporter(cls, value: str) -> str:
        if value not in {"console", "otlp", "none"}:
            raise ValueError("ENGRAM_OTEL_EXPORTER must be one of console, otlp, none")
        return value

    @field_validator("oidc_issuers", mode="before")
    @classmethod
    def _issuers_json(cls, value: Any) -> Any:
        # Compose passes the variable through empty when unset: empty is "none", not bad JSON.
        if isinstance(value, str):
            return json.loads(value) if value.strip() else ()
        return value

    def oidc_issuer_list(self) -> list[OidcIssuerSettings]:
        """Every configured issuer: ``ENGRAM_OIDC_ISSUERS`` and then ``ENGRAM_OIDC_ISSUER``'s.
        Raises ValueError (the process does not start) on one configured twice, one named like
        Engram's own tokens, or an ``ENGRAM_OIDC_ISSUER`` without its audience and orgs."""
        issuers = list(self.oidc_issuers)
        if self.oidc_issuer:
            if not self.oidc_audience or not self.oidc_orgs.strip():
                raise ValueError(
                    "ENGRAM_OIDC_ISSUER needs ENGRAM_OIDC_AUDIENCE and ENGRAM_OIDC_ORGS ('*' or ids)"
                )
            orgs = self.oidc_orgs.strip()
            claims = {
                name: value
                for name, value in (
                    ("org_claim", self.oidc_org_claim),
                    ("principal_claim", self.oidc_principal_claim),
                    ("principal_kind_claim", self.oidc_principal_kind_claim),
                    ("permissions_claim", self.oidc_permissions_claim),
                )
                if value
            }
            issuers.append(
                OidcIssuerSettings.model_validate(
                    {
                        "issuer": self.oidc_issuer,
                        "audience": self.oidc_audience,
                        "orgs": "*" if orgs == "*" else [o.strip() for o in orgs.split(",") if o.strip()],
                        "jwks_url": self.oidc_jwks_url,
                        **claims,
                    }
                )
            )
        seen = {self.token_issuer}
        for issuer in issuers:
            if issuer.issuer in seen:
                raise ValueError(
                    f"OIDC issuer {issuer.issuer!r} is configured twice or is Engram's own "
                    "(ENGRAM_TOKEN_ISSUER)"
                )
            seen.add(issuer.issuer)
        return issuers

    def nats_servers(self) -> list[str]:
        """``nats_url`` as the list of servers to try (one, or a cluster's seed list)."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    def purge_ledger_path(self) -> Path:
        """Where the purge ledger is (``purge_ledger``, else ``purge-ledger.jsonl`` in the data dir)."""
        if self.purge_ledger:
            return Path(self.purge_ledger)
        return self.data_dir.resolve() / "purge-ledger.jsonl"

    def signing_keys(self) -> dict[str, str]:
        """The ``kid → secret`` map from ``ENGRAM_TOKEN_KEYS`` (insertion order: first signs)."""
        keys: dict[str, str] = {}
        for part in self.token_keys.get_secret_value().split(","):
            if not part.strip():
                continue
            kid, sep, secret = part.strip().partition("=")
            if not sep or not kid or len(secret) < 32:
                raise ValueError(
                    "ENGRAM_TOKEN_KEYS must be 'kid=secret' pairs with secrets of 32+ characters"
                )
            keys[kid] = secret
        return keys
