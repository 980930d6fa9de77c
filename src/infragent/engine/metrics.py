"""Prometheus metrics of a serving engine (AsyncEngine or DisaggEngine) as the server exposes them: requests by
status, tokens, queue depths, cache usage, TTFT and ITL."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """One registry per server (tests run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self._computed_seen = 0
        self._preemptions_seen = 0
        self._expert_seen: dict[tuple[int, int], int] = {}
        self.requests = Counter("infragent:requests", "Requests by final status "
                                "(stop, length, abort, error, rejected = 429, invalid = other 4xx).",
                                ["status"], registry=registry)
        self.prompt_tokens = Counter("infragent:prompt_tokens", "Prompt tokens, by whether the usage was "
                                     "delivered to the client or the request was aborted.", ["outcome"],
                                     registry=registry)
        self.generation_tokens = Counter("infragent:generation_tokens", "Generated tokens, by outcome "
                                         "(delivered, aborted).", ["outcome"], registry=registry)
        self.running = Gauge("infragent:num_requests_running", "Requests in the running batch.", registry=registry)
        self.waiting = Gauge("infragent:num_requests_waiting", "Requests queued, not yet running.",
                             registry=registry)
        self.kv_blocks_used = Gauge("infragent:kv_blocks_used", "KV-cache blocks referenced by requests.",
                                    registry=registry)
        self.kv_blocks_total = Gauge("infragent:kv_blocks_total", "KV-cache blocks in the pool.", registry=registry)
        self.kv_usage = Gauge("infragent:kv_cache_usage_perc", "Fraction of the KV-cache blocks in use (0-1, as "
                              "vLLM's kv_cache_usage_perc).", registry=registry)
        self.preemptions = Counter("infragent:num_preemptions", "Running requests evicted (their KV freed) to make "
                                   "room, to be recomputed later.", registry=registry)
        self.state_slots_used = Gauge("infragent:state_slots_used", "KDA state slots held by requests.",
                                      registry=registry)
        self.state_slots_total = Gauge("infragent:state_slots_total", "KDA state slots in the pool.",
                                       registry=registry)
        self.ttft = Histogram("infragent:time_to_first_token_seconds", "Arrival to first generated token.",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.prefix_cache_queries = Counter("infragent:prefix_cache_queries", "Prompt tokens of requests that "
                                            "started generating (as vLLM's prefix_cache_queries).",
                                            registry=registry)
        self.prefix_cache_hits = Counter("infragent:prefix_cache_hits", "Of those, tokens served from the "
                                         "prefix cache (not computed).", registry=registry)
        self.prompt_tokens_computed = Counter("infragent:prompt_tokens_computed", "Prompt positions run through "
                                              "the model (a prefix-cache hit, or the other choices of an n > 1 "
                                              "request, compute none).", registry=registry)
        self.itl = Histogram("infragent:inter_token_latency_seconds", "Time between consecutive tokens of a "
                             "request.", buckets=LATENCY_BUCKETS, registry=registry)

        self.workers_alive = Gauge("infragent:disagg_workers_alive", "Disaggregated serving: live worker "
                                   "processes by role.", ["role"], registry=registry)
        self.worker_deaths = Counter("infragent:disagg_worker_deaths", "Disaggregated serving: worker processes "
                                     "that died, by role.", ["role"], registry=registry)
        self.request_failures = Counter("infragent:disagg_request_failures", "Disaggregated serving: requests "
                                        "failed by the router, by cause (worker_died, timeout, worker_error, "
                                        "no_worker).", ["cause"], registry=registry)
        self.expert_tokens = Counter("infragent:moe_expert_tokens", "MoE: token assignments routed to each expert "
                                     "(a token counts once per expert of its top-k), by layer and expert.",
                                     ["layer", "expert"], registry=registry)
        self.expert_imbalance = Gauge("infragent:moe_step_imbalance", "MoE: the last step's busiest expert's "
                                      "tokens over the mean per expert (1 = balanced), by layer.", ["layer"],
                                      registry=registry)

    def set_expert_load(self, load: dict[int, tuple[list[int], list[int]]]) -> None:
        """Bring the MoE counters to the model's running totals and the imbalance gauge to its last step
        (DecoderModel.expert_load)."""
        for layer, (totals, last) in load.items():
            for expert, total in enumerate(totals):
                seen = self._expert_seen.get((layer, expert), 0)
                if total > seen:
                    self.expert_tokens.labels(layer=str(layer), expert=str(expert)).inc(total - seen)
                    self._expert_seen[(layer, expert)] = total
            mean = sum(last) / len(last)
            if mean > 0:
                self.expert_imbalance.labels(layer=str(layer)).set(max(last) / mean)

    def delivered(self, status: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A request whose response (with usage) went out; status is its finish reason."""
        self.requests.labels(status=status).inc()
        self.prompt_tokens.labels(outcome="delivered").inc(prompt_tokens)
        self.generation_tokens.labels(outcome="delivered").inc(completion_tokens)

    def prefilled(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request's prompt is done (its first token came): how much of it the prefix cache served."""
        self.prefix_cache_queries.inc(prompt_tokens)
        self.prefix_cache_hits.inc(cached_tokens)

    def aborted(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A request dropped before it finished (client gone, or shutdown)."""
        self.requests.labels(status="abort").inc()
        self.prompt_tokens.labels(outcome="aborted").inc(prompt_tokens)
        self.generation_tokens.labels(outcome="aborted").inc(completion_tokens)

    def refused(self, status: str) -> None:
        """A request answered with a 4xx (status 'rejected' for 429, 'invalid' otherwise) or a 5xx ('error')."""
        self.requests.labels(status=status).inc()

    def set_state(self, running: int, waiting: int, kv_blocks_used: int, kv_blocks_total: int,
                  state_slots_used: int, state_slots_total: int, prompt_tokens_computed: int = 0,
                  preemptions: int = 0) -> None:
        """Update the gauges, and the computed-prompt and preemption counters to their running totals (called
        by the engine thread after each step)."""
        self.prompt_tokens_computed.inc(max(0, prompt_tokens_computed - self._computed_seen))
        self._computed_seen = max(self._computed_seen, prompt_tokens_computed)
        self.preemptions.inc(max(0, preemptions - self._preemptions_seen))
        self._preemptions_seen = max(self._preemptions_seen, preemptions)
        self.kv_usage.set(kv_blocks_used / kv_blocks_total if kv_blocks_total else 0.0)
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_blocks_used.set(kv_blocks_used)
        self.kv_blocks_total.set(kv_blocks_total)
        self.state_slots_used.set(state_slots_used)
        self.state_slots_total.set(state_slots_total)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
