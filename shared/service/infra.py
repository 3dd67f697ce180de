"""What every service is handed at the composition root: the database, the broker connection,
the token verifier, the request-reply edge, the outbox relay and the internal-message signer.
Built once per process by ``services.runtime``."""

from __future__ import annotations

from dataclasses import dataclass, field

from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.js import JetStreamContext

from shared.runtime.quotas import Quotas
from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenVerifier
from shared.security.provenance import MessageSigner
from shared.service.edge import Edge
from shared.storage.config_store import AgentConfigOwners
from shared.storage.db.engine import Database
from shared.storage.outbox import OutboxRelay

__all__ = ["Infra"]


@dataclass
class Infra:
    settings: EngramSettings
    db: Database
    #: Every token's one way to a credential: Engram's own and any OpenID Connect issuer's.
    tokens: TokenVerifier
    broker: NatsBroker
    relay: OutboxRelay
    #: Signs what this process publishes for other services; checks what it consumes from them.
    signer: MessageSigner
    #: Where JetStream delivers this process's pulled messages: the connection's own inbox
    #: prefix (FastStream's pull subscribers take it per subscriber, defaulting to ``_INBOX.``).
    inbox_prefix: bytes = b"_INBOX."
    #: Where the services register their request-reply operations (started by the runtime).
    edge: Edge = field(init=False)
    #: The organizations' and tokens' budgets (``ENGRAM_QUOTAS``), charged by the edge and ingest.
    quotas: Quotas = field(init=False)

    def __post_init__(self) -> None:
        self.quotas = Quotas(self.settings.quotas, redis_url=self.settings.redis_url)
        # A request that waited longer than the gateway would wait for it has no caller left.
        self.edge = Edge(
            self.tokens,
            agent_configs=AgentConfigOwners(self.db),
            default_wait_s=self.settings.http_request_timeout_s,
            quotas=self.quotas,
            workers=self.settings.edge_workers,
            org_queue=self.settings.edge_org_queue,
        )

    @property
    def nc(self) -> Client:
        return self.broker.connection

    @property
    def js(self) -> JetStreamContext:
        return self.nc.jetstream()

    def backoff(self, deliveries: int) -> float:
        """The redelivery delay after the ``deliveries``-th failed attempt."""
        steps = self.settings.redeliver_backoff_s
        return steps[min(deliveries, len(steps)) - 1] if steps else 1.0
