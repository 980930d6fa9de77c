"""One engine, one fresh process: load, warm up, time each workload once, write a JSON result.

Run by engine_throughput.py as: python engine_worker.py ENGINE SPEC.json OUT.json
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

WORKLOADS = ("c1", "c8", "c32")  # decode workloads: key -> prompts submitted at once
# Every instruction-set switch of the process held to AVX2, read before torch loads: our kernels, ATen's
# vectorized ops, MKL's GEMMs (transformers' linears) and oneDNN. An "-avx2" engine runs under these.
AVX2_ONLY = {"INFRAGENT_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _resident_bytes() -> dict[str, int]:
    """What is resident now, by kind (/proc/self/status): RssAnon (heap, torch's relocated libraries), RssFile
    (mapped files: libraries, the model file) and RssShmem (the KV cache, shared so that KV transfer can map it)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024
    return out


def run_infragent(spec: dict, weight_format: str = "fp32", kv_cache_dtype: str = "auto") -> dict:
    """Time infragent's LLM.generate on every workload, its weights held in weight_format, its KV cache in
    kv_cache_dtype."""
    import torch  # noqa: F401  (the floor below: what Python and torch hold before the engine exists)

    floor = _resident_bytes()
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    start = time.perf_counter()
    llm = LLM(model="llama", max_num_seqs=32, max_num_batched_tokens=512, num_threads=spec["threads"],
              weight_format=weight_format, kv_cache_dtype=kv_cache_dtype)
    result: dict = {"load_s": time.perf_counter() - start, "weight_nbytes": llm.engine.model.nbytes(),
                    "weight_format": weight_format, "kv_cache_dtype": kv_cache_dtype, "resident_torch": floor,
                    "kv_nbytes_per_token": llm.engine.kv_cache.nbytes_per_token()}
    if weight_format != "fp32":
        kernels = torch.ops.infragent.qa8_isa() if weight_format in ("gguf-a16", "gguf-a8") else \
            torch.ops.infragent.qgemm_isa()
        result["isa"] = kernels if llm.engine.model.block_kernels else "torch"
    result["weight_choice"] = llm.engine.weight_choice.to_dict()
    peaks = {"load": _peak_rss_bytes()}  # the high-water mark after each phase: KV is resident as it is used
    llm.generate(spec["warmup"], SamplingParams(max_tokens=8, ignore_eos=True))
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, temperature=0.0)
    samples, cached = {}, 0
    for key in WORKLOADS:
        prompts = spec["prompts"][key]
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - start
        _check(outs, len(prompts), spec["max_tokens"])
        samples[key] = sum(len(o.token_ids) for o in outs) / wall
        cached += sum(o.num_cached_tokens for o in outs)
        peaks[key] = _peak_rss_bytes()
        if key == "c1":
            o = outs[0]
            samples["c1_decode_only"] = (len(o.token_ids) - 1) / (o.finish_time - o.first_token_time)
            result["c1_token_ids"] = o.token_ids
    outs = llm.generate([spec["prefill_prompt"]], SamplingParams(max_tokens=1, ignore_eos=True))
    samples["prefill"] = len(spec["prefill_prompt"]) / outs[0].ttft_s
    peaks["prefill"] = _peak_rss_bytes()
    result.update(samples=samples, num_cached_tokens=cached, peak_rss_after=peaks, resident_end=_resident_bytes())
    return result


def _check(outs: list, n_prompts: int, max_tokens: int) -> None:
    """Fail loudly if any request errored or stopped short."""
    errors = [o.error for o in outs if getattr(o, "error", None)]
    if errors or len(outs) != n_prompts or any(len(o.token_ids) != max_tokens for o in outs):
        raise RuntimeError(f"bad outputs: {len(outs)}/{n_prompts} returned, errors={errors[:2]}, "
                           f"lengths={sorted({len(o.token_ids) for o in outs})}")


def load_transformers(spec: dict):
    """transformers' model from the spec's GGUF, in fp32, on the spec's thread count."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    path = Path(spec["gguf_path"])
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                **{dtype_kw: torch.float32}).eval()


def run_transformers(spec: dict) -> dict:
    """Time Hugging Face transformers batched greedy generate on the same GGUF."""
    import torch

    start = time.perf_counter()
    model = load_transformers(spec)
    result: dict = {"load_s": time.perf_counter() - start}
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id

    def generate(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)  # left padding, so every row ends at the same position
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=pad,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        return out[:, width:].tolist()

    generate(spec["warmup"], 8)
    samples = {}
    for key in WORKLOADS:
        start = time.perf_counter()
        rows = generate(spec["prompts"][key], spec["max_tokens"])
        samples[key] = sum(len(r) for r in rows) / (time.perf_counter() - start)
        if key == "c1":
            result["c1_token_ids"] = rows[0]
    start = time.perf_counter()
    generate([spec["prefill_prompt"]], 1)
    samples["prefill"] = len(spec["prefill_prompt"]) / (time.perf_counter() - start)
    result["samples"] = samples
    return result


def run_llamacpp(spec: dict) -> dict:
    """Time llama.cpp (llama-cpp-python) greedy decode and one long prefill. It does not batch: its server
    runs one request at a time, so c=8 and c=32 serve their prompts one after another, as that server would."""
    from llama_cpp import Llama

    threads = spec["threads"]
    start = time.perf_counter()
    llm = Llama(model_path=spec["gguf_path"], n_ctx=2048, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    result: dict = {"load_s": time.perf_counter() - start}

    def decode(prompt: list[int], new_tokens: int) -> tuple[list[int], float, float]:
        llm.reset()
        tokens, start = [], time.perf_counter()
        first = start
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                repeat_penalty=1.0, reset=True):
            tokens.append(int(tok))
            if len(tokens) == 1:
                first = time.perf_counter()
            if len(tokens) >= new_tokens:
                break
        return tokens, first - start, time.perf_counter() - start

    decode(spec["warmup"][0], 8)
    tokens, ttft, wall = decode(spec["prompts"]["c1"][0], spec["max_tokens"])
    samples = {"c1": len(tokens) / wall, "c1_decode_only": (len(tokens) - 1) / (wall - ttft)}
    for key in WORKLOADS[1:]:
        start, generated = time.perf_counter(), 0
        for prompt in spec["prompts"][key]:
            generated += len(decode(prompt, spec["max_tokens"])[0])
        samples[key] = generated / (time.perf_counter() - start)
    llm.reset()
    start = time.perf_counter()
    llm.eval(spec["prefill_prompt"])
    samples["prefill"] = len(spec["prefill_prompt"]) / (time.perf_counter() - start)
    result.update(samples=samples, c1_token_ids=tokens)
    return result


RUNNERS = {"infragent": run_infragent, "infragent-auto": lambda spec, **kv: run_infragent(spec, "auto", **kv),
           "infragent-gguf": lambda spec, **kv: run_infragent(spec, "gguf", **kv),
           "infragent-gguf-a16": lambda spec, **kv: run_infragent(spec, "gguf-a16", **kv),
           "infragent-gguf-a8": lambda spec, **kv: run_infragent(spec, "gguf-a8", **kv),
           "infragent-int8": lambda spec, **kv: run_infragent(spec, "int8", **kv),
           "transformers": run_transformers, "llamacpp": run_llamacpp}


def main() -> None:
    """Run one engine per the spec file and write its result (or its error) as JSON."""
    engine, spec_path, out_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    spec = json.loads(spec_path.read_text())
    if engine.endswith("-avx2"):  # the same engine as on an AVX2-only machine (run on an AVX-512 one)
        os.environ.update(AVX2_ONLY)
        engine = engine.removesuffix("-avx2")
    engine, _, kv = engine.partition("-kv-")  # infragent-...-kv-bf16: the KV cache in another dtype
    os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    try:
        result = RUNNERS[engine](spec) if not kv else RUNNERS[engine](spec, kv_cache_dtype=kv)
    except Exception as err:  # reported, not raised: the parent prints it and carries on
        result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    result.update(engine=engine, peak_rss_bytes=_peak_rss_bytes())
    out_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
