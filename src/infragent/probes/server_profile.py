"""A profile of a running server through its own endpoints, the convention vLLM and SGLang (and ours) share:
POST /start_profile, then POST /stop_profile, and the server writes torch.profiler (Kineto) traces to a
directory (vLLM: VLLM_TORCH_PROFILER_DIR; SGLang: SGLANG_TORCH_PROFILER_DIR; ours: --profile-dir). The new
trace files are found in that directory, or taken from the stop reply where the server names them, and
read by `analyze`.
"""
from __future__ import annotations

import time
from pathlib import Path

import httpx

TRACE_SUFFIXES = (".json", ".json.gz")


class ServerProfile:
    """start() and stop() around the load; .traces are the files it wrote, .notes what went wrong."""

    def __init__(self, base_url: str, profile_dir: str | None = None, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.profile_dir = Path(profile_dir) if profile_dir else None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.traces: list[str] = []
        self.notes: list[str] = []
        self.reading: dict | None = None  # analyze's answer on the first trace
        self._started_at: float | None = None
        self._stopped = False

    def start(self) -> None:
        """Ask the server to start profiling; a server without the endpoint gets a note."""
        answer = self._post("/start_profile")
        if answer is None:
            return
        if answer.status_code in (404, 405):
            self.notes.append(f"a profile (POST /start_profile answered {answer.status_code}: this server has no "
                              "profile endpoints; vLLM and SGLang have them with their profiler directory set)")
            return
        if answer.status_code >= 400:
            self.notes.append(f"a profile (POST /start_profile answered {answer.status_code}: {_reason(answer)})")
            return
        self._started_at = time.time()

    @property
    def active(self) -> bool:
        """Whether the server is profiling (start() succeeded and stop() has not run)."""
        return self._started_at is not None and not self.traces and not self._stopped

    def stop(self) -> None:
        """Stop profiling and collect the traces it wrote, then read the first one with analyze."""
        if self._started_at is None:
            return
        self._stopped = True
        answer = self._post("/stop_profile", timeout=120.0)
        if answer is None or answer.status_code >= 400:
            if answer is not None:
                self.notes.append(f"a profile (POST /stop_profile answered {answer.status_code})")
            return
        named = _named(answer)
        self.traces = named or self._written()
        if not self.traces:
            where = f"in {self.profile_dir}" if self.profile_dir else "(pass --profile-dir: the server's directory)"
            self.notes.append(f"a profile (the server profiled, but no new trace file was found {where})")
            return
        self._read(self.traces[0])

    def _written(self) -> list[str]:
        if self.profile_dir is None or not self.profile_dir.is_dir():
            return []
        fresh = [p for p in self.profile_dir.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                 and p.stat().st_mtime >= (self._started_at or 0) - 1]
        return [str(p) for p in sorted(fresh, key=lambda p: p.stat().st_mtime)]

    def _read(self, trace: str) -> None:
        from infragent.probes.analyze import analyze  # the trace analyses load only when a trace came
        try:
            feedback = analyze(trace)
        except (ValueError, OSError) as err:
            self.notes.append(f"the profile's trace ({trace}: {err})")
            return
        self.reading = {"trace": trace, "verdict": feedback.verdict, "finding": feedback.finding,
                        "headline": feedback.finding.split("; ")[0],
                        "next_probes": feedback.next_probes[:3]}

    def _post(self, path: str, timeout: float = 30.0) -> httpx.Response | None:
        try:
            return httpx.post(f"{self.base_url}{path}", headers=self.headers, timeout=timeout)
        except httpx.HTTPError as err:
            self.notes.append(f"a profile (POST {path}: {type(err).__name__})")
            return None

    def to_dict(self) -> dict:
        """A JSON-ready record of what was asked and found."""
        return {"traces": self.traces, "notes": self.notes, "reading": self.reading}


def _named(answer: httpx.Response) -> list[str]:
    try:
        body = answer.json()
    except ValueError:
        return []
    traces = body.get("traces") if isinstance(body, dict) else None
    return [str(t) for t in traces if Path(str(t)).is_file()] if isinstance(traces, list) else []


def _reason(answer: httpx.Response) -> str:
    """The error's message where the body is OpenAI-shaped JSON, else its first 160 characters."""
    try:
        return str(answer.json()["error"]["message"])[:160]
    except (ValueError, KeyError, TypeError):
        return answer.text.strip()[:160]
