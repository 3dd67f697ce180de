"""An organization's webhooks (SPEC 11, docs/adr/0102-tenant-feeds.md): registered through the
``engram.webhooks.*`` operations (:mod:`.api`), fed from the organization's feed by a durable
consumer (:mod:`.fanout`), delivered at least once, signed per Standard Webhooks, by a worker
(:mod:`.delivery`) that retries with backoff and dead-letters; :mod:`.targets` keeps them off the
deployment's own network."""
