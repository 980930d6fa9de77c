"""Proposers: where the next change comes from (search, an LLM, any command)."""
