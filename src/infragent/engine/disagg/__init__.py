"""Prefill/decode disaggregation: a router, prefill and decode worker processes, and a KV store between them."""
