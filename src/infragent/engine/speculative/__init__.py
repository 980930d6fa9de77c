"""Speculative decoding: drafters (n-gram prompt lookup), greedy verification, and KDA state rollback."""
