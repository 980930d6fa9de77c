"""Shared fixtures: the real model and tokenizer are loaded once per test session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import their reference helpers by name


@pytest.fixture(scope="session")
def llama_weights():
    """Spec and fp32 weights of SmolLM2-135M from the GGUF."""
    from infragent.engine.models.llama import load_llama

    return load_llama()
