"""Settings, read once at the composition root (``ENGRAM_*`` environment variables or a
``.env`` file) and passed down. Domain code never reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["EngramSettings"]


class EngramSettings(BaseSettings):
    """Everything a service or the embedded stack needs to know about its surroundings."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_", env_file=".env", extra="ignore")

    #: External NATS; empty means the embedded stack starts its own. A cluster takes several
    #: URLs separated by commas (the seed list; the client learns the other nodes from the
    #: cluster and fails over between them): ``nats://n1:4222,nats://n2:4222,nats://n3:4222``.
    nats_url: str = ""
    #: TLS to NATS (SPEC 8: off-box traffic is encrypted). A CA file turns TLS on and verifies
    #: the servers with it; a client certificate and key are sent when the servers ask for one.
    nats_tls_ca_file: str = ""
    nats_tls_cert_file: str = ""
    nats_tls_key_file: str = ""
    #: This process's NATS identity: a user nkey seed (``SU…``; see infra/nats/engram-auth.conf).
    #: Empty connects without one (a ``user:password@`` in the URL still works). ``engram up``
    #: sets it to a fresh key of its own at every start.
    nats_nkey_seed: SecretStr = SecretStr("")
    #: The HTTP gateway's NATS identity, when it differs from the services' (``engram up`` makes
    #: one per run; ``engram serve gateway`` uses ``nats_nkey_seed``, its process's own).
    gateway_nkey_seed: SecretStr = SecretStr("")
    #: External Postgres (``postgresql://…``); empty means the embedded stack starts its own.
    database_url: str = ""
    #: TLS to Postgres, as for NATS: a CA file verifies the server (and its host name); a client
    #: certificate and key are sent when given. ``?ssl=require`` in the URL also works without a CA.
    database_tls_ca_file: str = ""
    database_tls_cert_file: str = ""
    database_tls_key_file: str = ""
    redis_url: str = ""
    data_dir: Path = Path(".engram")

    #: Signing keys for tokens, ``kid=secret`` pairs separated by commas; the first one signs.
    #: Empty in the embedded stack means a development key generated into the data dir.
    token_keys: SecretStr = SecretStr("")
    token_issuer: str = "engram"  # noqa: S105 (an issuer name, not a secret)

    #: OpenAI-compatible chat endpoint for distill; empty selects the built-in distiller.
    distill_model_url: str = ""
    distill_model: str = "gpt-4o-mini"
    distill_api_key: SecretStr = SecretStr("")
    distill_timeout_s: float = Field(default=20.0, gt=0)
    distill_retries: int = Field(default=2, ge=0, le=10)

    #: How long raw sessions (and their tokens, in headers) stay in ``ENGRAM_SESSIONS``: long
    #: enough to ride out an outage of the services, short because traces hold raw text.
    session_retention_s: int = Field(default=24 * 3600, ge=600)
    #: How long dead letters are kept for an operator to inspect and replay.
    dead_letter_retention_s: int = Field(default=7 * 24 * 3600, ge=3600)

    #: Replicas of every Engram stream (and so of its consumers): 1 on one server (``engram up``),
    #: 3 on a 3-node cluster, so that losing a node loses no acknowledged message.
    stream_replicas: int = Field(default=1, ge=1, le=5)

    #: ``engram serve``'s health endpoint (``/healthz``, ``/readyz``) for orchestrator probes.
    #: Off (0) unless set: several processes on one host would collide on a fixed default; the
    #: compose file and the Helm chart set 8081. Listens on all interfaces because probes come
    #: from outside the container.
    health_port: int = Field(default=0, ge=0, le=65535)
    health_host: str = "0.0.0.0"  # noqa: S104 (a container's probes reach it from outside)
    #: The HTTP gateway (``engram serve gateway``; ``engram up`` serves it too). ``engram up`` takes
    #: a free port when this one is taken; 0 always takes a free one. Loopback by default; a
    #: container sets ``0.0.0.0``.
    http_port: int = Field(default=8080, ge=0, le=65535)
    http_host: str = "127.0.0.1"
    #: Browser origins allowed to call the gateway (CORS), comma-separated; empty (the default)
    #: sends no CORS headers at all, so browsers on other origins cannot read replies.
    http_cors_origins: str = ""
    #: How long the gateway waits for a service's reply when the operation names no timeout; the
    #: services leave a request that has waited longer than this in their queue (no one waits for it).
    http_request_timeout_s: float = Field(default=10.0, gt=0)
    #: After SIGTERM: stop fetching, finish and ack in-flight work, flush the outbox, exit 0 —
    #: within this bound (below Kubernetes' default 30 s grace period), else exit 1.
    shutdown_timeout_s: float = Field(default=25.0, gt=0)

    #: JetStream redelivery: attempts before a message is dead-lettered, and the backoff.
    max_deliver: int = Field(default=5, ge=1)
    redeliver_backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    #: Short, so what a crashed worker held is redelivered within seconds of a restart; a live
    #: worker keeps its messages with in-progress heartbeats (shared/consumer.py: Batch).
    ack_wait_s: float = Field(default=5.0, gt=0)

    #: The deployment's embedder: ``all-MiniLM-L6-v2`` (the default: in-process, onnxruntime, from the
    #: packaged weights), ``hashing-384`` (lexical feature hashing, not semantic; for tests that
    #: need speed), or a model name served at ``embedder_url`` (any OpenAI-compatible
    #: ``/v1/embeddings``). Changing it needs ``engram reindex`` (docs/decisions.md).
    embedder: str = "all-MiniLM-L6-v2"
    embedder_url: str = ""
    embedder_api_key: SecretStr = SecretStr("")
    embedder_dimension: int = Field(default=384, ge=8, le=8192)
    #: Vector store: a Qdrant server URL; empty means Qdrant Edge in-process under ``data_dir``.
    #: ``none`` runs without vectors (semantic recall answers VECTOR_UNAVAILABLE).
    vector_store: str = ""
    #: How long recall trusts a memory config it read (a config change takes effect within it).
    config_cache_s: float = Field(default=1.0, ge=0)
    #: How long a hot recall reply may live in Redis (``redis_url``); 0 turns the cache off.
    #: Writes and erasures invalidate earlier; this bounds what an invalidation could not reach.
    result_cache_s: int = Field(default=30, ge=0)
    #: How often governance deletes expired entries (recall hides them the moment they expire).
    retention_sweep_s: float = Field(default=30.0, gt=0)
    #: How long a list/export page token stays valid.
    page_token_ttl_s: int = Field(default=3600, ge=60)

    #: OpenTelemetry: ``console`` (local), ``otlp`` (to ``otel_endpoint``) or ``none``.
    otel_exporter: str = "none"
    otel_endpoint: str = ""
    log_level: str = "INFO"
    log_json: bool = False

    @field_validator("otel_exporter")
    @classmethod
    def _known_exporter(cls, value: str) -> str:
        if value not in {"console", "otlp", "none"}:
            raise ValueError("ENGRAM_OTEL_EXPORTER must be one of console, otlp, none")
        return value

    def nats_servers(self) -> list[str]:
        """``nats_url`` as the list of servers to try (one, or a cluster's seed list)."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

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
