"""The OpenAI-compatible HTTP server around the engine (FastAPI app + engine thread)."""
