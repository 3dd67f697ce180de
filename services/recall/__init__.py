"""Recall (SPEC 5): who sees what, ranking strategies, the token budget and the rendered context.

The domain modules (``visibility``, ``candidates``, ``ranking``, ``budget``, ``render``,
``overrides``) are pure functions with no I/O; ``queries``, ``service`` and ``side_effects`` wire
them to Postgres, the vector index and NATS.
"""
