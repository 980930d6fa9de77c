"""More kinds of real GPU traces for the trace analyses, beside ../shared/traces/h200 (one prepared run on a CUDA
machine; each case guarded, so one failure keeps the others; stops starting cases after --budget-s):

    python3 benchmarks/make_gpu_traces.py OUT_DIR [--budget-s 150]

- decode_b1_eager: batch-1 greedy decode of a small Llama-like decoder (4 layers, hidden 1024, bf16, KV cache
  grown by torch.cat), one token per step under a torch.profiler schedule (ProfilerStep#N ranges): launch-bound;
- item_sync_steps: each step runs a few GEMMs, reads a scalar back with .item() (a DtoH copy and a sync) in the
  middle, then a few more: the host drains the queue twice a step;
- two_stream_gemms: GEMMs on two streams at once (compute/compute overlap across streams);
- compiled_mlp: the MLP stack of make_traces.py under torch.compile (Triton kernels), then mode
  "reduce-overhead" (CUDA-graph replays of compiled kernels).
Writes OUT_DIR/NAME.json.gz and OUT_DIR/notes.json (sizes, timings, errors).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time
import traceback

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

ACTS = [ProfilerActivity.CPU, ProfilerActivity.CUDA]


class Decoder(torch.nn.Module):
    """Embedding, N pre-norm blocks (attention with a KV cache, gated MLP), norm, LM head."""

    def __init__(self, layers: int = 4, hidden: int = 1024, heads: int = 16, vocab: int = 32000) -> None:
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, 3 * hidden, bias=False) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.up = torch.nn.ModuleList(torch.nn.Linear(hidden, 2 * 2816, bias=False) for _ in range(layers))
        self.down = torch.nn.ModuleList(torch.nn.Linear(2816, hidden, bias=False) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(hidden) for _ in range(2 * layers + 1))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: list) -> torch.Tensor:
        x = self.embed(ids)
        b, t, _ = x.shape
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self.norms[2 * i](x)).view(b, t, 3, self.heads, self.d).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            if len(cache) > i:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
            x = x + self.out[i](a.transpose(1, 2).reshape(b, t, -1))
            gate, up = self.up[i](self.norms[2 * i + 1](x)).chunk(2, -1)
            x = x + self.down[i](torch.nn.functional.silu(gate) * up)
        return self.head(self.norms[-1](x[:, -1]))


def decode_b1_eager(dev: str) -> profile:
    model = Decoder().to(dev).to(torch.bfloat16).eval()
    prompt = torch.randint(0, 32000, (1, 64), device=dev)
    with torch.no_grad():
        cache: list = []
        token = model(prompt, cache).argmax(-1, keepdim=True)
        with profile(activities=ACTS, schedule=schedule(wait=1, warmup=2, active=12)) as prof:
            for _ in range(15):
                with record_function("decode_step"):
                    token = model(token, cache).argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                prof.step()
    return prof


def item_sync_steps(dev: str) -> profile:
    w = [torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16) for _ in range(6)]
    x = torch.randn(64, 2048, device=dev, dtype=torch.bfloat16)
    with torch.no_grad(), profile(activities=ACTS) as prof:
        for _ in range(8):
            with record_function("step"):
                h = x
                for m in w[:3]:
                    h = torch.relu(h @ m)
                scale = float(h.abs().max().item())  # a DtoH copy and a sync in the middle of the step
                h = h / max(scale, 1e-3)
                for m in w[3:]:
                    h = torch.relu(h @ m)
                float(h.sum().item())
            prof.step()
    return prof


def two_stream_gemms(dev: str) -> profile:
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with profile(activities=ACTS) as prof:
        for _ in range(4):
            with record_function("step"):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(10):
                        b @ b
                for _ in range(10):
                    a @ a
                torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            prof.step()
    return prof


def compiled_mlp(dev: str) -> profile:
    layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU())
                                   for _ in range(24)]).to(dev).to(torch.bfloat16).eval()
    x = torch.randn(16, 1024, device=dev, dtype=torch.bfloat16)
    fused = torch.compile(layers)
    graphed = torch.compile(layers, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            fused(x)
            graphed(x)
        torch.cuda.synchronize()
        with profile(activities=ACTS) as prof:
            for name, fn in (("compiled", fused), ("compiled_graphs", graphed)):
                for _ in range(8):
                    with record_function(name):
                        fn(x)
                    torch.cuda.synchronize()
                    prof.step()
    return prof


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--budget-s", type=float, default=150.0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    notes: dict = {"torch": torch.__version__, "cuda": torch.version.cuda,
                   "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    began = time.time()
    for case in (decode_b1_eager, item_sync_steps, two_stream_gemms, compiled_mlp):
        if time.time() - began > args.budget_s:
            notes[case.__name__] = {"skipped": "over the budget"}
            continue
        t0 = time.time()
        try:
            prof = case("cuda")
            path = f"{args.out}/{case.__name__}.json"
            prof.export_chrome_trace(path)
            with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
                g.write(f.read())
            notes[case.__name__] = {"bytes": os.path.getsize(path), "gz_bytes": os.path.getsize(path + ".gz")}
            os.remove(path)
        except Exception:  # noqa: BLE001 - one case failing must not cost the others
            notes[case.__name__] = {"error": traceback.format_exc()[-2000:]}
        notes[case.__name__]["seconds"] = round(time.time() - t0, 1)
        print(case.__name__, notes[case.__name__], flush=True)
        with open(f"{args.out}/notes.json", "w") as f:
            json.dump(notes, f, indent=1)


if __name__ == "__main__":
    main()
