"""NATS identities and their permissions: who may connect, and what each identity may publish and
subscribe to (SPEC 8). ``permissions`` is the table, ``render`` turns it into nats-server config,
``store`` keeps the identities of an ``engram up`` data dir, ``infra`` renders the production file."""
