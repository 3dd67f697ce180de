"""``engram up``'s own servers (NATS, Postgres) and the stack it runs, and the backup and restore
of its data dir."""
