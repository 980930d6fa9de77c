"""Executors: where trials run when not one after another here (a Ray cluster)."""
