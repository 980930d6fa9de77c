"""`infragent mcp`: every probe and analysis the CLI has, the ledger read-only, and criteria evaluation, as
MCP tools over stdio (the official `mcp` SDK), so any coding agent can drive them.

- Same tools, same parameters as the CLI: check, bench, record, gil, roofline, analyze, loadgen, quality,
  validate_spec; runs, show (a run's trajectory), ledger_record, artifact, evaluate_criteria.
- Every parameter has a description and an example in the tool's schema.
- Replies are compact (probes/compact.py: at most 4 KB); the whole result is an artifact the reply names,
  and `artifact` reads a slice of it.
- A failed call answers with what was wrong, where in the user's code, and a fix (agent/mcp/tool_errors.py);
  a traceback only with `infragent mcp --tracebacks`.
- The user's modules under the root are imported afresh when their files changed since the last call.
- Every path resolves inside the workspace root; one that leads outside is refused.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from infragent.agent.mcp.tool_errors import explain
from infragent.probes.callables import refresh_modules, stamp_modules
from infragent.probes.compact import REPLY_LIMIT, as_tool_calls, compact_json

LEDGER = ".infragent/ledger.sqlite"
CALLABLE = ("A callable: module:function importable from the workspace root, or path/file.py:function "
            "(a path inside the root)")
INPUTS = ("An inputs factory (module:function or file.py:function) that infragent calls as factory(trial, "
          "generator) — trial an int, generator a seeded torch.Generator — returning the arguments: a tuple, a "
          "dict of keyword arguments, or one value; with inputs_style='seed' it is called as factory(seed)")
STYLE = "How the inputs factory is called: 'trial' = factory(trial, generator), 'seed' = factory(seed)"
BUDGET = "Most seconds the probe may spend; past it the probe stops and says 'inconclusive: budget' with what it has"
PARTITION = ("Also run the candidate shard by shard and localize a difference: column:N, row:N, heads:N:dim=D, "
             "splitk:N or batch:N")

Fn = Annotated[str, Field(description=CALLABLE, examples=["kernels.py:fast_matmul", "mypkg.ops:rmsnorm"])]
Inputs = Annotated[str, Field(description=INPUTS, examples=["cases.py:matmul_inputs"])]
Style = Annotated[str, Field(description=STYLE, examples=["trial", "seed"])]
Ledger = Annotated[str, Field(description="The ledger SQLite file (inside the root)", examples=[LEDGER])]
RunId = Annotated[int, Field(description="A run id from `runs`", examples=[1])]


TOOLS = {"check", "bench", "record", "gil", "roofline", "analyze", "loadgen", "quality", "validate_spec", "runs",
         "show", "ledger_record", "artifact", "evaluate_criteria"}
POSITIONAL = {"check": "candidate", "bench": "fn", "record": "workload", "gil": "workload", "roofline": "fn",
              "analyze": "trace"}  # the argument a CLI command takes without a flag


def with_tool_calls(reply: str) -> str:
    """A compact reply whose next_probes (CLI text) are given as tool calls of this server."""
    try:
        data = json.loads(reply)
    except ValueError:
        return reply
    if not isinstance(data, dict) or not data.get("next_probes") or not all(isinstance(p, str)
                                                                           for p in data["next_probes"]):
        return reply
    data["next_probes"] = as_tool_calls(data["next_probes"], TOOLS, POSITIONAL)
    return json.dumps(data)


class OutsideRoot(ToolError):
    """A path that resolves outside the workspace root."""


def build_server(root: str | Path, tracebacks: bool = False) -> MCPServer:
    """The MCP server with every tool confined to root."""
    root = Path(root).resolve()
    server = MCPServer(name="infragent", instructions=(
        "Performance probes for LLM inference and kernels. A probe answers with a compact Feedback (at most "
        "4 KB): verdict, finding, numbers with confidence intervals, locality, next probes worth running, and "
        "under 'full' the artifact with everything else (read slices of it with `artifact`). Callables are "
        "module:function or file.py:function; inputs factories are called as factory(trial, generator). "
        f"Paths are relative to the workspace root {root}. Edited files are re-imported on the next call."))

    def tool(fn: Callable[..., str]) -> Callable[..., str]:
        """Register fn: fresh user modules, compact answers, errors as answers."""
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> str:
            refresh_modules(root)
            try:
                return with_tool_calls(fn(*args, **kwargs))
            except ToolError:
                raise
            except Exception as err:  # every failure is an answer with a fix, never a bare "Error executing"
                raise ToolError(explain(err, root, fn.__name__, tracebacks)) from None
            finally:
                stamp_modules(root)

        return server.tool(structured_output=False)(wrapper)  # the payload once, as text

    def inside(path: str) -> Path:
        resolved = (root / path).resolve()
        if not resolved.is_relative_to(root):
            raise OutsideRoot(f"{path}: resolves to {resolved}, outside the workspace root {root}; "
                              "give a path inside it")
        return resolved

    def named(name: str) -> str:
        """A callable name with its file path (if any) made absolute inside the root."""
        module, _, attr = name.partition(":")
        return f"{inside(module)}:{attr}" if module.endswith(".py") else name

    def resolve(name: str, what: str) -> Callable[..., Any]:
        from infragent.probes.callables import resolve as resolve_name

        return resolve_name(named(name), what)

    def factory(name: str, style: str) -> Callable[..., Any]:
        from infragent.probes.inputs import inputs_factory

        return inputs_factory(resolve(name, "inputs"), style, f"inputs {name!r}")

    @tool
    def check(candidate: Fn, reference: Annotated[str, Field(description="The callable giving the right answer; "
                                                                         + CALLABLE, examples=["kernels.py:matmul_ref"])],
              inputs: Inputs, partition: Annotated[str | None, Field(description=PARTITION, examples=["column:4"])] = None,
              trials: Annotated[int, Field(description="Fresh input draws", examples=[24])] = 24,
              inputs_style: Style = "trial",
              budget_s: Annotated[float, Field(description=BUDGET, examples=[60])] = 60.0) -> str:
        """Is the candidate right? Compare it with a reference on fresh random inputs; guards catch input
        mutation, aliasing, caching and NaN; a partition localizes the differing shard and column."""
        from infragent.probes.check import run_check

        fb = run_check(resolve(candidate, "candidate"), resolve(reference, "reference"), factory(inputs, inputs_style),
                       partition=partition, trials=trials, budget_s=budget_s)
        return compact_json(fb)

    @tool
    def bench(fn: Fn, vs: Annotated[str | None, Field(description="The baseline to compare against (A/B, "
                                                                  "interleaved pairs); " + CALLABLE,
                                                      examples=["kernels.py:matmul_ref"])] = None,
              inputs: Annotated[str | None, Field(description=INPUTS, examples=["cases.py:matmul_inputs"])] = None,
              budget_s: Annotated[float, Field(description=BUDGET + " (warm-up included)", examples=[2.0])] = 2.0,
              metric: Annotated[str, Field(description="'time': wall time per call; 'return': the callable returns "
                                                       "the work it did (e.g. a loop that runs for a fixed time) and "
                                                       "bench compares work per second", examples=["time", "return"])] = "time",
              inputs_style: Style = "trial",
              threads: Annotated[int, Field(description="torch threads, fixed during the run", examples=[2])] = 2) -> str:
        """Is it faster? Time fn (alone: its time and noise floor; with vs: A/B) in interleaved pairs, with a
        bootstrap CI of the ratio; flags a fixed-duration callable measured on the wrong metric."""
        from infragent.probes.bench import run_bench

        made = factory(inputs, inputs_style) if inputs else None
        b = resolve(vs, "vs") if vs else None
        return compact_json(run_bench(resolve(fn, "function"), b, made, budget_s=budget_s, threads=threads,
                                      names=(fn, vs), metric=metric))

    @tool
    def record(workload: Annotated[str, Field(description="A function that runs the workload (no arguments); "
                                                          + CALLABLE, examples=["serve_demo.py:run"])],
               output: Annotated[str, Field(description="Where to write the Chrome trace (inside the root)",
                                            examples=["trace.json"])] = "trace.json",
               budget_s: Annotated[float, Field(description=BUDGET, examples=[120])] = 120.0) -> str:
        """Where does the time go? Run a workload with the span recorder on, write a Chrome trace (Perfetto) and
        attribute it (top spans, threads)."""
        from infragent.probes.record import run_record

        return compact_json(run_record(resolve(workload, "workload"), inside(output), budget_s=budget_s))

    @tool
    def gil(workload: Annotated[str, Field(description="A function that runs a multi-threaded workload (no "
                                                       "arguments); " + CALLABLE, examples=["pipeline.py:run"])],
            budget_s: Annotated[float, Field(description=BUDGET, examples=[120])] = 120.0) -> str:
        """Who holds the GIL and who waits? Runs the workload in a child under py-spy: per thread (and span, when
        there are spans) held, waited and run-queue time, the starved thread and the holder."""
        from infragent.probes.gil import run_gil

        resolve(workload, "workload")  # a bad name fails here, with the fix, not in the child
        return compact_json(run_gil(named(workload), timeout_s=budget_s))

    @tool
    def roofline(fn: Fn, inputs: Inputs,
                 reference: Annotated[str | None, Field(description="A callable doing only the useful work (e.g. "
                                                                     "without padding): names the redundant work; "
                                                                     + CALLABLE, examples=["kernels.py:kda_step"])] = None,
                 inputs_style: Style = "trial",
                 budget_s: Annotated[float, Field(description="Seconds of timing per callable (it stops before "
                                                              "twice this)", examples=[1.0])] = 1.0) -> str:
        """What bounds it? FLOPs and bytes against the machine's measured peaks: compute-, memory- or
        overhead-bound; with a reference, the share of the work that is redundant."""
        from infragent.probes.roofline import run_roofline

        ref = resolve(reference, "reference") if reference else None
        return compact_json(run_roofline(resolve(fn, "function"), factory(inputs, inputs_style), reference=ref,
                                         budget_s=budget_s))

    @tool
    def analyze(trace: Annotated[str, Field(description="A trace file: infragent's, Chrome JSON or Kineto (.json "
                                                        "or .json.gz); or a folder of Kineto traces, one per rank",
                                            examples=["trace.json"])],
                vs: Annotated[str | None, Field(description="A baseline trace: diff and attribute the change",
                                                examples=["baseline.json"])] = None,
                overlap_a: Annotated[str | None, Field(description="With overlap_b: the share of A's time B overlaps "
                                                                   "(span name, glob, cat:NAME or thread:NAME)",
                                                       examples=["kv.transfer"])] = None,
                overlap_b: Annotated[str | None, Field(description="See overlap_a", examples=["compute"])] = None,
                top: Annotated[int, Field(description="Rows in the top-N lists", examples=[10])] = 10,
                metric: Annotated[str, Field(description="What the end-to-end time is called in the diff",
                                             examples=["TTFT"])] = "wall") -> str:
        """Attribute a trace: breakdown, thread-aware overlap, idle gaps, critical path; with vs, the diff. A GPU
        trace is read for its GPU first: idle time explained (waiting on the host?), kernels, overlap across streams."""
        from infragent.probes.analyze import analyze as run_analyze

        pairs = [(overlap_a, overlap_b)] if overlap_a and overlap_b else []
        return compact_json(run_analyze(inside(trace), inside(vs) if vs else None, pairs, top=top, metric=metric))

    @tool
    def loadgen(base_url: Annotated[str, Field(description="An OpenAI-compatible server's root",
                                               examples=["http://127.0.0.1:8000"])],
                num_prompts: Annotated[int, Field(description="Requests per repeat", examples=[32])] = 32,
                max_concurrency: Annotated[int | None, Field(description="Most requests in flight",
                                                             examples=[8])] = None,
                request_rate: Annotated[float | None, Field(description="Requests per second (None: all at once)",
                                                            examples=[4.0])] = None,
                random_input_len: Annotated[int, Field(description="Prompt tokens", examples=[128])] = 128,
                random_output_len: Annotated[int, Field(description="Output tokens", examples=[64])] = 64,
                endpoint: Annotated[str, Field(description="/v1/completions or /v1/chat/completions",
                                               examples=["/v1/completions"])] = "/v1/completions",
                model: Annotated[str | None, Field(description="Model name (default: the server's first)",
                                                   examples=["llama"])] = None,
                repeats: Annotated[int, Field(description="Runs; medians with CIs across them", examples=[3])] = 1,
                seed: Annotated[int | None, Field(description="Seed of the random prompts (default: fresh each "
                                                              "run, so no run hits an earlier one's prefix cache)",
                                                  examples=[0])] = None,
                arrival: Annotated[str, Field(description="burst, constant, poisson or gamma",
                                              examples=["poisson"])] = "gamma",
                burstiness: Annotated[float, Field(description="Gamma shape: 1 = Poisson, <1 burstier",
                                                   examples=[1.0])] = 1.0,
                length_dist: Annotated[str, Field(description="fixed, uniform or lognormal",
                                                  examples=["uniform"])] = "fixed",
                random_range_ratio: Annotated[float, Field(description="Spread of the lengths around their mean",
                                                           examples=[0.5])] = 0.0,
                dataset_name: Annotated[str, Field(description="random, file or sharegpt",
                                                   examples=["random"])] = "random",
                dataset_path: Annotated[str | None, Field(description="The prompts file for file or sharegpt "
                                                                      "(inside the root)",
                                                          examples=["prompts.jsonl"])] = None,
                goodput: Annotated[list[str] | None, Field(description="SLOs in ms for goodput",
                                                           examples=[["ttft:500", "tpot:50"]])] = None,
                warmup: Annotated[int, Field(description="Requests sent first and left out of the metrics",
                                             examples=[2])] = 2,
                api_key: Annotated[str | None, Field(description="Bearer key the server requires",
                                                     examples=["sk-local"])] = None,
                budget_s: Annotated[float, Field(description=BUDGET + " (all repeats)", examples=[600])] = 600.0) -> str:
        """Serving metrics end to end against a server (vLLM bench serve's): TTFT, TPOT, ITL, E2E latency and
        throughput, with CIs across repeats."""
        from infragent.probes.loadgen import LoadConfig, parse_goodput, run_loadgen

        config = LoadConfig(base_url=base_url, model=model, endpoint=endpoint, num_prompts=num_prompts,
                            max_concurrency=max_concurrency, request_rate=request_rate or float("inf"),
                            random_input_len=random_input_len, random_output_len=random_output_len,
                            repeats=repeats, seed=seed, progress=False, arrival=arrival, burstiness=burstiness,
                            length_dist=length_dist, random_range_ratio=random_range_ratio,
                            dataset_name=dataset_name, dataset_path=str(inside(dataset_path)) if dataset_path else None,
                            goodput_ms=parse_goodput(goodput or []), warmup=warmup, api_key=api_key,
                            budget_s=budget_s)
        return compact_json(run_loadgen(config))

    @tool
    def diagnose(base_url: Annotated[str, Field(description="A running OpenAI-compatible server's root (vLLM, "
                                                            "SGLang, llama.cpp, ours)",
                                                examples=["http://127.0.0.1:8000"])],
                 seconds: Annotated[float, Field(description="How long the load runs and the server is read",
                                                 examples=[15])] = 15.0,
                 concurrency: Annotated[int, Field(description="Requests in flight at once", examples=[16])] = 16,
                 input_len: Annotated[int, Field(description="Prompt tokens per request", examples=[256])] = 256,
                 output_len: Annotated[int, Field(description="Output tokens per request", examples=[64])] = 64,
                 endpoint: Annotated[str, Field(description="/v1/completions or /v1/chat/completions",
                                                examples=["/v1/completions"])] = "/v1/completions",
                 pid: Annotated[int | None, Field(description="The server's pid (default: the listener of the "
                                                              "URL's port on this machine)", examples=[12345])] = None,
                 profile_dir: Annotated[str | None, Field(description="Where the server writes its profiler "
                                                                      "traces (inside the root)",
                                                          examples=["profiles"])] = None,
                 pyspy: Annotated[bool, Field(description="Sample the server's Python stacks with py-spy",
                                              examples=[True])] = True,
                 api_key: Annotated[str | None, Field(description="Bearer key the server requires",
                                                      examples=["sk-local"])] = None) -> str:
        """What limits a running server, from outside: a short fresh-prompt load while its metrics, threads,
        Python stacks and profile are read; bottlenecks with their evidence and the knobs that act on them."""
        from infragent.probes.diagnose import DiagnoseConfig, run_diagnose

        return compact_json(run_diagnose(DiagnoseConfig(
            base_url, pid=pid, profile_dir=str(inside(profile_dir)) if profile_dir else None, seconds=seconds,
            concurrency=concurrency, input_len=input_len, output_len=output_len, endpoint=endpoint,
            api_key=api_key, pyspy=pyspy)))

    @tool
    def quality(model: Annotated[str, Field(description="llama (SmolLM2-135M) or hybrid", examples=["llama"])] = "llama",
                quantization: Annotated[str | None, Field(description="Weight/activation quantization",
                                                          examples=["w8a8"])] = None,
                kv_cache_dtype: Annotated[str | None, Field(description="KV-cache dtype", examples=["int8"])] = None,
                windows: Annotated[int, Field(description="Held-out text windows", examples=[8])] = 8,
                window: Annotated[int, Field(description="Tokens per window", examples=[128])] = 128,
                prompts: Annotated[int, Field(description="Prompts for greedy agreement", examples=[16])] = 16,
                budget_s: Annotated[float, Field(description=BUDGET + " (model loading included)",
                                                 examples=[600])] = 600.0) -> str:
        """The quality gates of a quantized configuration against fp32: perplexity, KL divergence, greedy
        agreement, each with a CI."""
        from infragent.probes.quality import QualityPlan, quality_of

        knobs = {k: v for k, v in (("quantization", quantization), ("kv_cache_dtype", kv_cache_dtype)) if v}
        return compact_json(quality_of(model, knobs, QualityPlan(windows=windows, window=window, prompts=prompts),
                                       budget_s=budget_s))

    @tool
    def validate_spec(spec: Annotated[str, Field(description="A spec TOML (inside the root)",
                                                 examples=["spec.toml"])]) -> str:
        """Validate a spec and return the plan an optimize run would follow."""
        from infragent.lab.spec import load_spec, plan

        return _fit("\n".join(plan(load_spec(inside(spec)))))

    @tool
    def runs(ledger: Ledger = LEDGER) -> str:
        """The ledger's runs, newest first: id, kind, status, probes, spec."""
        from infragent.lab.ledger import Ledger as Book

        rows = [{k: r.get(k) for k in ("id", "kind", "status", "probes", "spec", "note")}
                for r in reversed(Book(inside(ledger)).runs())]
        return _fit_list(rows, "runs")

    @tool
    def show(run_id: RunId, ledger: Ledger = LEDGER) -> str:
        """A run's trajectory: each hypothesis -> probe -> verdict -> decision, each candidate's outcome, and its
        probe records (key, verdict, finding; read one whole with ledger_record)."""
        from infragent.lab.ledger import Ledger as Book
        from infragent.lab.trajectory import chains

        book = Book(inside(ledger))
        row = book.run(run_id)
        data = {"run": {k: row.get(k) for k in ("id", "kind", "status", "spec_path", "note")},
                "chains": [f"{h['key']}: {h['claim'][:160]} -> {h['settled_by'] or h['probe']} "
                           f"{(h['probe_verdict'] or '').upper()} -> {h['status'].upper()} -> {h['decision'][:120]}"
                           for h in chains(book, run_id)],
                "candidates": [f"trial/{c['trial']}: {c['status']}: {c['why'][:160]}" for c in book.candidates(run_id)],
                "probes": [f"{r['key']} [{r['probe']}] {r['verdict'].upper()}: {r['finding'][:200]}"
                           for r in book.probe_results(run_id)]}
        return _fit_dict(data)

    @tool
    def ledger_record(run_id: RunId, key: Annotated[str, Field(description="A probe record's key (see show)",
                                                                examples=["trial/0/e2e"])],
                      ledger: Ledger = LEDGER) -> str:
        """One probe record of a run, compact; its whole Feedback is in the ledger (and its evidence files)."""
        from infragent.lab.ledger import Ledger as Book
        from infragent.probes.feedback import Feedback, Measure

        record = next((r for r in Book(inside(ledger)).probe_results(run_id) if r["key"] == key), None)
        if record is None:
            raise LookupError(f"run {run_id} has no record {key!r}: see `show` for its keys")
        data = record["feedback"]
        numbers = {k: Measure(**m) for k, m in data.get("numbers", {}).items()}
        fb = Feedback(data["probe"], data["verdict"], data["finding"], numbers, data.get("locality", {}),
                      [], data.get("next_probes", []), {})
        reply = json.loads(compact_json(fb))
        reply["evidence"] = [e["path"] for e in data.get("evidence", [])][:4]
        return json.dumps(reply)

    @tool
    def artifact(path: Annotated[str, Field(description="An artifact file a reply named (its 'full' or "
                                                        "'evidence'), inside the root", examples=[
                                                            ".infragent/artifacts/check-feedback-20261201.json"])],
                 key: Annotated[str | None, Field(description="For JSON: a dotted path into it (list items by "
                                                              "index)", examples=["details.trials.0"])] = None,
                 offset: Annotated[int, Field(description="First character of the slice", examples=[0])] = 0,
                 length: Annotated[int, Field(description="Characters (at most 3500)", examples=[2000])] = 2000) -> str:
        """A slice of an artifact: the per-trial and per-shard tables, samples and raw outputs a compact reply
        left out."""
        text = inside(path).read_text(errors="replace")
        if key:
            try:
                value: Any = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"{path} is not JSON, so it has no key {key!r}: read it without a key") from None
            for part in key.split("."):
                value = value[int(part)] if isinstance(value, list) else value[part]
            text = json.dumps(value, default=str)
        length = max(0, min(length, REPLY_LIMIT - 600))
        while True:  # escaping can grow the slice: shrink it until the reply fits
            reply = json.dumps({"path": path, "key": key, "offset": offset, "total_chars": len(text),
                                "text": text[offset:offset + length],
                                "next_offset": offset + length if offset + length < len(text) else None})
            if len(reply.encode()) <= REPLY_LIMIT:
                return reply
            length = length * 3 // 4

    @tool
    def evaluate_criteria(spec: Annotated[str, Field(description="A spec TOML (inside the root)",
                                                     examples=["spec.toml"])],
                          run_id: RunId, ledger: Ledger = LEDGER) -> str:
        """Judge a spec's absolute criteria on a measure run's recorded loadgen repeats."""
        from infragent.lab.criteria import judge
        from infragent.lab.ledger import Ledger as Book
        from infragent.lab.measure import recorded_runs
        from infragent.lab.spec import load_spec

        parsed, book = load_spec(inside(spec)), Book(inside(ledger))
        out = []
        for criterion in parsed.criteria:
            if criterion.max_regression is not None:
                continue
            scenario = next(s for s in parsed.scenarios if s.name == criterion.scenario)
            runs_ = recorded_runs(book, run_id, scenario)
            out += [{"verdict": j.verdict, "message": j.message} for j in
                    judge(criterion, runs_, bounds=tuple(scenario.buckets))]
        return _fit_list(out, "judgements")

    return server


def _fit(text: str) -> str:
    """Text cut to the reply limit, saying so."""
    if len(text.encode()) <= REPLY_LIMIT:
        return text
    return text[: REPLY_LIMIT - 200] + "\n… (cut: the reply limit is 4 KB)"


def _fit_list(rows: list[dict], name: str) -> str:
    """As many rows as fit the reply limit, and how many were left out."""
    kept: list[dict] = []
    for row in rows:
        if len(json.dumps({name: kept + [row], "left_out": len(rows)}, default=str).encode()) > REPLY_LIMIT:
            break
        kept.append(row)
    return json.dumps({name: kept, "left_out": len(rows) - len(kept)}, default=str)


def _fit_dict(data: dict[str, Any]) -> str:
    """A dict of lists cut to the reply limit: the longest list loses its last item until it fits."""
    left: dict[str, int] = {}
    while len(json.dumps({**data, "left_out": left}, default=str).encode()) > REPLY_LIMIT:
        longest = max((k for k, v in data.items() if isinstance(v, list) and v), key=lambda k: len(json.dumps(data[k])))
        data[longest] = data[longest][:-1]
        left[longest] = left.get(longest, 0) + 1
    return json.dumps({**data, "left_out": left}, default=str)
