"""The `infragent generate` command: completion text on stdout, field-naming errors on stderr, exit 2."""
from __future__ import annotations

import subprocess
import sys

import pytest


def infragent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infragent.cli", *args], capture_output=True, text=True, timeout=300)


def test_generate_prints_only_the_completion():
    run = infragent("generate", "--model", "llama", "--max-tokens", "6", "The capital of France is")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and "Paris" in run.stdout
    assert "loaded" not in run.stdout.lower()


def test_greedy_output_is_stable_across_processes():
    args = ("generate", "--model", "hybrid", "--max-tokens", "5", "hello", "a longer second prompt here")
    first, second = infragent(*args), infragent(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and len(first.stdout.splitlines()) == 2


@pytest.mark.parametrize("args, field", [
    (("--model", "gpt5"), "model"),
    (("--max-tokens", "0"), "max_tokens"),
    (("--top-p", "1.5"), "top_p"),
    (("--top-p", "0"), "top_p"),
    (("--kernels", "flash"), "kernels"),
])
def test_bad_arguments_name_the_field_and_exit_2(args, field):
    run = infragent("generate", *args, "hello")
    assert run.returncode == 2
    assert run.stderr.startswith(f"error: {field}") and run.stdout == ""


def test_prompt_longer_than_context_fails_alone():
    run = infragent("generate", "--max-tokens", "3", "Hello there", "word " * 5000)
    assert run.returncode == 2
    assert "request 1: prompt" in run.stderr and "max_model_len" in run.stderr
    assert len(run.stdout.splitlines()) == 1 and run.stdout.strip()
