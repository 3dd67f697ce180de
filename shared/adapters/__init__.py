"""Adapters of the ports in ``shared.ports`` (chosen at the composition root): embedders,
distillers, vector indexes, and the guarded JSON-over-HTTP call to a model endpoint."""
