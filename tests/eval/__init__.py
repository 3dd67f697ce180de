"""Recall-quality evaluations (``make eval``): run against data kept outside the repository."""
