"""`make demo`: the main job. Until the agent loop lands, a short real-model generation plus throughput."""
from __future__ import annotations

import time

from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams


def main() -> None:
    """Chat with SmolLM2-135M through the engine, then batch 16 requests and print tokens/s."""
    start = time.perf_counter()
    llm = LLM(model="llama")
    print(f"loaded SmolLM2-135M-Instruct (GGUF → fp32) in {time.perf_counter() - start:.1f} s")
    question = "What is the capital of France? Answer in one sentence."
    [answer] = llm.chat([{"role": "user", "content": question}], SamplingParams(max_tokens=48))
    print(f"user: {question}\nassistant: {answer.text.strip()}\n")
    prompts = [f"Write a short story about robot number {i}." for i in range(16)]
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    print(f"throughput: {len(outputs)} requests, {tokens} output tokens in {elapsed:.2f} s "
          f"= {tokens / elapsed:.1f} output tok/s (continuous batching, fp32, "
          f"{llm.engine.config.resolved_threads()} threads)")


if __name__ == "__main__":
    main()
