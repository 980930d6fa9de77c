"""The spec: one TOML file with the target, the knobs, the scenarios and the acceptance criteria.

    [target]                      kind = "engine" (model = "llama") or kind = "command" with
                                  command = "vllm serve M --port {port} --max-num-seqs {max_num_seqs}",
                                  base_url = "http://127.0.0.1:{port}", ready_url = ".../health" ({port}: a free
                                  port per launch; {python}: the interpreter running infragent;
                                  {spec_dir}: the spec's folder),
                                  ready_timeout_s, hang_timeout_s
                                  or kind = "kernel" with candidate, reference, inputs = "FILE.py:function"
                                  (files next to the spec; knobs become keyword arguments of the candidate),
                                  optional partition, bench_inputs, workload, rtol;
                                  code = "PATH" (what code proposers patch, in a git worktree) and
                                  tests = "COMMAND" (run in each candidate's worktree first);
                                  resources = { num_cpus = 1, num_gpus = 0, custom = { node_kind = 1 } } (what
                                  one trial holds on a Ray node: its baseline twin, candidate and load generator)
    [executor]                    kind = "local" (default: trials one after another, in-process) or "ray"
                                  (trials concurrently on a Ray cluster); address = "ray://..." or "auto"
    [knobs.NAME]                  type = "int" | "float" | "choice" | "bool"; domain = [lo, hi] or choices;
                                  touches = ["decode", "kv.gather"]   (spans or kernels the knob acts on)
                                  acts_on = ["batch_limit"]   (what it moves in any stack, as `diagnose`
                                  names bottlenecks: batch_limit, kv_capacity, prefill_chunk, threads, tokenizer)
    [[scenarios]]                 name, and loadgen fields (num_prompts, max_concurrency, request_rate, ...)
    [[playbook]]                  knobs = { max_num_seqs = 8 }, why = "..." : a tuning guide's moves, in the order
                                  it tries them (--proposer playbook; a diagnosis reorders them)
    [[criteria]]                  scenario, metric, phase, bucket; max/min (absolute) or
                                  max_regression (relative to the baseline) with test and alpha;
                                  quality gates (perplexity_increase, kl_divergence, greedy_agreement)
                                  take max/min and no scenario

Validation is pydantic; every error becomes one line "FILE:LINE: FIELD: what is wrong".
"""
from __future__ import annotations

import math
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infragent.probes.acts_on import ACTS_ON

PHASES = ("prefill", "decode", "request")
# metric -> (phase it belongs to, whether higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "ttft_median_ms": ("prefill", False), "ttft_p90_ms": ("prefill", False), "ttft_p99_ms": ("prefill", False),
    "prefill_tok_s": ("prefill", True),
    "tpot_median_ms": ("decode", False), "tpot_p90_ms": ("decode", False), "tpot_p99_ms": ("decode", False),
    "itl_median_ms": ("decode", False), "itl_p99_ms": ("decode", False), "decode_tok_s": ("decode", True),
    "e2el_median_ms": ("request", False), "e2el_p99_ms": ("request", False),
    "output_tok_s": ("request", True), "request_per_s": ("request", True), "goodput": ("request", True),
}
# kernel targets: judged on the gates' probes, not on a loadgen scenario
KERNEL_METRICS: dict[str, tuple[str, bool]] = {
    "rel_error": ("kernel", False),  # worst relative error vs the reference over the check's trials and shards
    "time_ratio": ("kernel", False),  # candidate time / baseline time (bench, paired)
    "reference_time_ratio": ("kernel", False),  # candidate time / reference time (bench, paired)
}
METRICS.update(KERNEL_METRICS)
# engine targets with quantized weights or KV: judged on the quality probe against an fp32 copy of the engine
QUALITY_METRICS: dict[str, tuple[str, bool]] = {
    "perplexity_increase": ("quality", False),  # perplexity / fp32 perplexity − 1 on held-out text
    "kl_divergence": ("quality", False),  # mean KL(fp32 ‖ candidate) of next-token distributions, nats
    "greedy_agreement": ("quality", True),  # share of fp32's greedy tokens reproduced before the first miss
}
METRICS.update(QUALITY_METRICS)


class SpecError(ValueError):
    """A spec that cannot be used; str() is one line with file, line and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Resources(_Strict):
    """What one trial holds on a Ray node (a candidate, its baseline twin and the load generator)."""

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    custom: dict[str, float] = Field(default_factory=dict)  # the cluster's own resource names

    @field_validator("custom")
    @classmethod
    def _positive(cls, custom: dict[str, float]) -> dict[str, float]:
        for name, amount in custom.items():
            if amount <= 0:
                raise ValueError(f"a trial needs a positive amount of {name}, got {amount}")
        return custom

    def ray_demand(self) -> dict[str, float]:
        """Ray's names for the amounts (CPU, GPU, custom), zeros left out."""
        demand = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.custom}
        return {name: amount for name, amount in demand.items() if amount > 0}


class Executor(_Strict):
    """Where trials run: here, one after another, or concurrently on a Ray cluster."""

    kind: Literal["local", "ray"] = "local"
    address: Optional[str] = None  # a Ray cluster's address ("auto", "ray://HOST:10001"); None starts a local one


class Target(_Strict):
    """What is optimized: the built-in engine, or a launch command with {knob} placeholders."""

    kind: Literal["engine", "command", "kernel"] = "engine"
    model: str = "llama"
    command: Optional[str] = None
    ready_url: Optional[str] = None
    base_url: Optional[str] = None
    ready_timeout_s: float = Field(300.0, gt=0)  # launch -> proven ready; longer means the target hung
    hang_timeout_s: float = Field(60.0, gt=0)  # a ready target that answers nothing (not even health) this long hung
    # readiness needs the port's listening socket to be the launch's process group; false for a server whose
    # socket is another process's (a container's port proxy, a remote host): then the port must be free at launch
    listener_check: bool = True
    serve_args: list[str] = Field(default_factory=list)  # extra `infragent serve` flags for an engine target
    # kernel targets: "FILE.py:function" next to the spec
    candidate: Optional[str] = None
    reference: Optional[str] = None
    inputs: Optional[str] = None
    bench_inputs: Optional[str] = None  # the case the benchmark times (default: inputs' first draw)
    workload: Optional[str] = None  # a run with threads, for the trace and GIL probes
    partition: Optional[str] = None  # also check the candidate partitioned, e.g. "column:2"
    rtol: Optional[float] = Field(None, gt=0)  # the check's tolerance (default: by dtype and K)
    # the code code proposers may change, relative to the spec: a kernel target's folder (default: the spec's);
    # for an engine target a git checkout of this project (the server then runs from a worktree's src/); for a
    # command target the repository its command runs in (launched inside the candidate's worktree)
    code: Optional[str] = None
    tests: Optional[str] = None  # a test command run in each candidate's worktree before any probe (rc 0 = pass)
    resources: Resources = Field(default_factory=Resources)  # one trial's hold on a Ray node (--executor ray)

    @model_validator(mode="after")
    def _kind_has_its_fields(self) -> "Target":
        if self.tests is not None and self.code is None and self.kind != "kernel":
            raise ValueError("tests: a test command runs in a candidate's worktree; give code = \"PATH\" too")
        if self.kind == "command" and not (self.command and self.ready_url and self.base_url):
            raise ValueError("a command target needs command, ready_url and base_url")
        if self.kind == "kernel":
            for name in ("candidate", "reference", "inputs"):
                if not getattr(self, name):
                    raise ValueError(f"{name}: a kernel target needs {name} = \"FILE.py:function\"")
            for name in ("candidate", "reference", "inputs", "bench_inputs", "workload"):
                value = getattr(self, name)
                if value and not re.fullmatch(r"[\w./-]+\.py:[\w.]+", value):
                    raise ValueError(f"{name}: {value!r} must look like FILE.py:function")
        return self


class Knob(_Strict):
    """A launch parameter the agent may change."""

    type: Literal["int", "float", "choice", "bool"]
    domain: list[Union[int, float, str, bool]] = Field(default_factory=list)
    default: Optional[Union[int, float, str, bool]] = None
    touches: list[str] = Field(default_factory=list)
    acts_on: list[str] = Field(default_factory=list)  # what it moves in any stack: batch_limit, kv_capacity, ...

    @field_validator("acts_on")
    @classmethod
    def _known_acts_on(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in ACTS_ON]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not something a knob acts on here; use any of {', '.join(ACTS_ON)}")
        return value

    @model_validator(mode="after")
    def _domain_fits_type(self) -> "Knob":
        if self.type in ("int", "float"):
            if len(self.domain) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in self.domain):
                raise ValueError(f"domain: a {self.type} knob needs [low, high]")
            if self.type == "int" and not all(isinstance(v, int) for v in self.domain):
                raise ValueError("domain: an int knob needs integer bounds")
            if self.domain[0] > self.domain[1]:
                raise ValueError(f"domain: low {self.domain[0]} is above high {self.domain[1]}")
        elif self.type == "choice" and len(self.domain) < 2:
            raise ValueError("domain: a choice knob needs at least two choices")
        elif self.type == "bool" and self.domain and set(self.domain) != {True, False}:
            raise ValueError("domain: a bool knob's domain is [true, false] (or leave it out)")
        return self

    def refuses(self, value: Any) -> str | None:
        """Why this knob cannot take `value` (wrong type or outside its domain), or None when it can."""
        if self.type == "bool":
            return None if isinstance(value, bool) else "needs true or false"
        if self.type == "choice":
            return None if value in self.domain else f"is not one of {self.domain}"
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or (self.type == "int" and not isinstance(value, int)):
            return f"needs {'an integer' if self.type == 'int' else 'a number'}"
        return None if self.domain[0] <= value <= self.domain[1] else f"is outside [{self.domain[0]}, {self.domain[1]}]"


class Move(_Strict):
    """One playbook move: knob values a tuning guide would try next, and why."""

    knobs: dict[str, Union[bool, int, float, str]]
    why: str = ""


class Scenario(_Strict):
    """A workload: loadgen settings under a name."""

    name: str = Field(min_length=1)
    num_prompts: int = Field(64, ge=1)
    max_concurrency: Optional[int] = Field(None, ge=1)
    request_rate: float = Field(math.inf, gt=0)
    burstiness: float = Field(1.0, gt=0)
    dataset_name: Literal["random", "file", "sharegpt"] = "random"
    dataset_path: Optional[str] = None
    random_input_len: int = Field(128, ge=1)
    random_output_len: int = Field(64, ge=1)
    length_dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    random_range_ratio: float = Field(0.0, ge=0, lt=1)
    buckets: list[int] = Field(default_factory=lambda: [128, 512, 2048, 8192])
    repeats: int = Field(3, ge=1)
    goodput_ms: dict[Literal["ttft", "tpot", "e2el"], float] = Field(default_factory=dict)  # SLOs for goodput


class Criterion(_Strict):
    """An acceptance rule for one scenario, phase and prompt-length bucket (never averaged across them)."""

    scenario: str = ""  # empty for a kernel target's criteria
    metric: str
    bucket: str = "all"  # a bucket name like "<=512", or "each" for every bucket separately
    max: Optional[float] = None
    min: Optional[float] = None
    max_regression: Optional[float] = Field(None, gt=0, lt=1)  # relative to the baseline, e.g. 0.05
    test: Literal["paired", "mann-whitney", "bootstrap"] = "paired"
    alpha: float = Field(0.05, gt=0, lt=0.5)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
        return metric

    @model_validator(mode="after")
    def _one_kind(self) -> "Criterion":
        kinds = [k for k in ("max", "min", "max_regression") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of max, min (absolute) or max_regression (relative)")
        return self

    @property
    def phase(self) -> str:
        return METRICS[self.metric][0]

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric][1]


class Spec(_Strict):
    """The whole spec file."""

    target: Target = Field(default_factory=Target)
    knobs: dict[str, Knob] = Field(default_factory=dict)
    scenarios: list[Scenario] = Field(default_factory=list)
    criteria: list[Criterion] = Field(default_factory=list)
    executor: Executor = Field(default_factory=Executor)
    playbook: list[Move] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references_resolve(self) -> "Spec":
        names = [s.name for s in self.scenarios]
        if len(set(names)) != len(names):
            raise ValueError(f"scenarios: names must be unique, got {names}")
        kernel = self.target.kind == "kernel"
        if not kernel and not names:
            raise ValueError("scenarios: a serving target needs at least one [[scenarios]] table")
        for i, c in enumerate(self.criteria):
            if (c.metric in KERNEL_METRICS) != kernel:
                allowed = ", ".join(KERNEL_METRICS if kernel else (m for m in METRICS if m not in KERNEL_METRICS))
                raise ValueError(f"criteria.{i}.metric: {c.metric!r} does not apply to a {self.target.kind} "
                                 f"target; choose one of {allowed}")
            if c.metric in QUALITY_METRICS:
                if self.target.kind != "engine":
                    raise ValueError(f"criteria.{i}.metric: {c.metric} is a quality gate; it runs the engine "
                                     f"in-process, so it needs target kind = \"engine\"")
                if c.max_regression is not None:
                    raise ValueError(f"criteria.{i}.max_regression: {c.metric} is already relative to an fp32 "
                                     f"copy of the engine; give max or min")
                continue
            if kernel:
                continue
            if c.scenario not in names:
                raise ValueError(f"criteria.{i}.scenario: unknown scenario {c.scenario!r}; known: {', '.join(names)}")
            if c.metric == "goodput" and not self.scenarios[names.index(c.scenario)].goodput_ms:
                raise ValueError(f"criteria.{i}.metric: goodput needs goodput_ms SLOs on scenario {c.scenario!r}")
        if self.target.kind == "engine":
            from infragent.engine.knobs import KNOBS, KnobError, from_argv

            try:
                from_argv(self.target.serve_args)
            except KnobError as err:
                raise ValueError(f"target.serve_args: {err}") from None
            for name in self.knobs:
                if name not in KNOBS:
                    raise ValueError(f"knobs.{name}: unknown knob for the engine target; known: {', '.join(KNOBS)}")
        for field in ("command", "base_url", "ready_url"):
            for name in re.findall(r"{(\w+)}", getattr(self.target, field) or ""):
                if name not in self.knobs and name not in ("port", "python"):
                    raise ValueError(f"target.{field}: placeholder {{{name}}} is not a declared knob (nor {{port}} "
                                     "or {python})")
        for i, move in enumerate(self.playbook):
            if not move.knobs:
                raise ValueError(f"playbook.{i}.knobs: a move sets at least one knob, e.g. knobs = {{ name = value }}")
            for name, value in move.knobs.items():
                if name not in self.knobs:
                    raise ValueError(f"playbook.{i}.knobs: {name!r} is not a declared knob; known: "
                                     f"{', '.join(self.knobs) or 'none'}")
                refused = self.knobs[name].refuses(value)
                if refused:
                    raise ValueError(f"playbook.{i}.knobs: {name} = {value!r} {refused}")
        urls_port = any("{port}" in (u or "") for u in (self.target.base_url, self.target.ready_url))
        if self.target.kind == "command" and urls_port and "{port}" not in (self.target.command or ""):
            raise ValueError("target.command: base_url or ready_url uses {port} but the command never receives "
                             "it; add --port {port} (or your server's port flag) to the command")
        return self


PACKS = Path(__file__).resolve().parents[1] / "scenarios"


def resolve_spec(spec: str | Path | None) -> Path:
    """A spec file, a scenario-pack folder (its spec.toml), a pack name, PACK:VARIANT (the pack's VARIANT.toml,
    e.g. kv-transfer-gil:moe), or None for the engine-slo pack."""
    if spec is None:
        return PACKS / "engine-slo" / "spec.toml"
    path = Path(spec)
    pack, _, variant = str(spec).partition(":")
    if path.is_dir():
        path = path / "spec.toml"
    elif not path.exists() and (PACKS / str(spec) / "spec.toml").exists():
        path = PACKS / str(spec) / "spec.toml"
    elif not path.exists() and variant and (PACKS / pack / "spec.toml").exists():
        path = PACKS / pack / f"{variant}.toml"
        if not path.exists():
            variants = sorted(p.stem for p in (PACKS / pack).glob("*.toml") if p.stem != "spec")
            raise SpecError(f"{spec}: pack {pack} has no variant {variant!r}"
                            + (f" (variants: {', '.join(variants)})" if variants else " (it has no variants)"))
    if not path.exists():
        packs = ", ".join(sorted(p.name for p in PACKS.iterdir() if (p / "spec.toml").exists())) if PACKS.exists() else ""
        raise SpecError(f"{spec}: no such spec file or scenario pack" + (f" (packs: {packs})" if packs else ""))
    return path


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec; raises SpecError with one line: FILE:LINE: FIELD: message."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"{path}: cannot read ({err.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(err))
        where = f":{match.group(1)}" if match else ""
        reason = re.sub(r" \(at line.*", "", str(err))
        raise SpecError(f"{path}{where}: malformed TOML: {reason}") from None
    command = data.get("target", {}).get("command") if isinstance(data.get("target"), dict) else None
    if isinstance(command, str):  # {spec_dir}: the spec's folder, for a launcher script kept beside it
        data["target"]["command"] = command.replace("{spec_dir}", shlex.quote(str(path.resolve().parent)))
    try:
        return Spec.model_validate(data)
    except ValidationError as err:
        # An unknown (misspelled) field explains a "required" error next to it, so it is reported first.
        first = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = [str(p) for p in first["loc"]]
        message = first["msg"].removeprefix("Value error, ")
        named = re.match(r"([a-z_]+(?:\.[\w]+)*): (.*)", message)
        if named:  # a model-level check that names its field: "domain: ..." or "criteria.1.scenario: ..."
            field, message = named.groups()
            loc = field.split(".") if "." in field else loc + [field]
        if first["type"] == "extra_forbidden":
            message = "unknown field; check its spelling"
        raise SpecError(f"{path}:{locate(text, loc)}: {'.'.join(loc) or 'spec'}: {message}") from None


def locate(text: str, loc: list[str]) -> int:
    """Best line number for a field path like ['knobs', 'max_num_seqs', 'domain'] or ['criteria', '1', 'metric']."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    i = 0
    while i < len(loc):
        part = loc[i]
        if i + 1 < len(loc) and loc[i + 1].isdigit():  # array of tables: the n-th [[part]] header
            index, count = int(loc[i + 1]), -1
            for n in range(start, end):
                if lines[n].strip() == f"[[{part}]]":
                    count += 1
                    if count == index:
                        start = n
                        end = next((m for m in range(n + 1, len(lines)) if lines[m].lstrip().startswith("[")),
                                   len(lines))
                        break
            i += 2
            continue
        header = next((n for n in range(start, end) if re.match(rf"\s*\[+\s*{re.escape('.'.join(loc[:i + 1]))}\s*\]+",
                                                                  lines[n])), None)
        if header is not None:
            start = header
            end = next((m for m in range(header + 1, len(lines)) if lines[m].lstrip().startswith("[")), len(lines))
        else:
            key = next((n for n in range(start, end) if re.match(rf"\s*{re.escape(part)}\s*=", lines[n])), None)
            if key is not None:
                return key + 1
        i += 1
    return start + 1


def plan(spec: Spec, baseline: dict[str, Any] | None = None) -> list[str]:
    """The steps an optimize run would take, as readable lines (for --dry-run)."""
    target = spec.target
    what = {"engine": f" {target.model}", "command": f": {target.command}",
            "kernel": f": {target.candidate} vs reference {target.reference} on {target.inputs}"}[target.kind]
    lines = [f"target: {target.kind}{what}"]
    for name, knob in spec.knobs.items():
        lines.append(f"knob {name}: {knob.type} in {knob.domain}" + (f", touches {', '.join(knob.touches)}"
                                                                     if knob.touches else ""))
    for i, move in enumerate(spec.playbook):
        values = ", ".join(f"{n} = {v!r}" for n, v in move.knobs.items())
        lines.append(f"playbook move {i + 1}: {values}" + (f" ({move.why})" if move.why else ""))
    for s in spec.scenarios:
        rate = "all at once" if math.isinf(s.request_rate) else f"{s.request_rate} req/s"
        lines.append(f"scenario {s.name}: {s.num_prompts} prompts x {s.repeats} repeats, {rate}, concurrency "
                     f"{s.max_concurrency or 'unlimited'}, input {s.random_input_len} ({s.length_dist}), "
                     f"output {s.random_output_len}, buckets {s.buckets}")
    for c in spec.criteria:
        rule = (f"<= {c.max}" if c.max is not None else f">= {c.min}" if c.min is not None
                else f"regression <= {c.max_regression:.0%} vs baseline ({c.test}, alpha {c.alpha})")
        where = "kernel" if target.kind == "kernel" else f"{c.scenario} / {c.phase} / bucket {c.bucket}"
        lines.append(f"criterion [{where}] {c.metric} {rule}")
    if target.kind == "kernel":
        lines.append("steps: the feedback ladder on the baseline (check" + (f" partitioned {target.partition}"
                     if target.partition else "") + ", roofline vs the reference, traced calls" +
                     (", workload trace and GIL" if target.workload else "") + ", bench vs the reference) -> "
                     "hypotheses -> per proposal (knobs or a patch in its own git worktree), in a subprocess with "
                     "a timeout and a memory limit: check -> bench vs baseline and reference -> criteria -> ledger")
        return lines
    first = ("trace the baseline and attribute it -> hypotheses (suspect spans -> knobs)" if target.kind == "engine"
             else "diagnose the baseline's launch from outside (metrics, threads, stacks, profile) -> hypotheses "
                  "(bottlenecks -> the knobs whose acts_on moves them; none declared: every knob is a suspect)")
    if target.code:
        lines.append(f"code: {target.code} (baseline and every patch run from their own git worktrees of it; your tree "
                     "is never touched)" + (f"; tests: {target.tests}" if target.tests else ""))
        if target.kind == "engine":
            lines.append("per patch, before any server starts: the spec's tests -> greedy tokens in-process vs the "
                         "baseline's code -> the step microbenchmark (prefill and decode steps, alternating rounds)")
    lines.append(f"steps: {first} -> launch the baseline on its own port -> per proposal: launch on its own port (the "
                 "listener proven to be its process group) -> check greedy outputs -> local A/B over blocks (a win "
                 "beyond the A/A floor, measured against a twin launch of the baseline when first needed) -> "
                 "end-to-end only after a local win, more repeats while a criterion is inconclusive -> judge every "
                 "criterion per phase and bucket -> ledger (--feedback e2e-only: end to end only)")
    if target.kind == "command" and "{port}" not in (target.command or ""):
        lines.append("refused: [target] command has no {port}; optimize runs the baseline and each candidate at once, "
                     "so each launch needs its own port (add --port {port}, and {port} in base_url and ready_url)")
    return lines
