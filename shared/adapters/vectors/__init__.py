"""Adapters of the :class:`~shared.ports.VectorIndex` port, chosen at the composition root.

- ``qdrant_edge.py``: :class:`QdrantEdgeIndex`, Qdrant Edge in-process under a directory (the
  embedded default); HNSW graphs are built by a child process in the background.
- ``qdrant_server.py``: :class:`QdrantServerIndex`, a Qdrant server or cluster through
  ``qdrant-client`` (its local mode stands in for the server in tests).

Both store the tenancy fields beside each vector, refuse a search without organization, agent
config or owner scopes, and pass one behaviour suite (``tests/contract/test_vector_index.py``).
What they share is ``_tenancy.py``: the payload keys, the tenant filter's conditions (each
adapter only renders them in its library's classes), the checks on vectors and the order of hits.
"""
