"""What Engram keeps and how it changes it: the tables and migrations (db), the memory-entry
gateway (entries), the transactional outbox and inbox, the hash-chained audit log,
dead-letters, the one erase path and the purge ledger, memory configs and the Redis caches."""
