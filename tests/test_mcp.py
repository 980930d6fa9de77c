"""`infragent mcp` driven by the official SDK client over stdio: every tool answers a good call with a compact
reply (at most 4 KB, on the largest inputs here) and a bad call with what was wrong and how to fix it; an
edited module is seen on the next call without a restart; paths outside the workspace root are refused."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from infragent.lab.ledger import Ledger
from infragent.lab.measure import measure
from infragent.probes.compact import REPLY_LIMIT
from infragent.probes.gil import find_pyspy
from server_fixture import thread_server, tiny_target_toml

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
SPEC = tiny_target_toml() + """
[[scenarios]]
name = "chat"
num_prompts = 4
max_concurrency = 2
random_input_len = 16
random_output_len = 4
repeats = 1

[[criteria]]
scenario = "chat"
metric = "ttft_median_ms"
max = 60000
"""


def _workspace(root: Path) -> None:
    root.mkdir()
    for name in ("agent_cases.py", "gil_cases.py"):
        shutil.copy(TESTS / name, root / name)
    (root / "kern.py").write_text("def mm(x, w):\n    return x @ w\n")
    (root / "spec.toml").write_text(SPEC)
    (root / "broken.toml").write_text(SPEC.replace('metric = "ttft_median_ms"', 'metric = "ttft_mediam_ms"'))
    (root / "not_a_trace.json").write_text(json.dumps({"hello": 1}))
    measure(root / "spec.toml", Ledger(root / ".infragent" / "ledger.sqlite"), log=lambda line: None)


GOOD = [  # (tool, arguments): each answers with a compact reply
    ("check", {"candidate": "agent_cases.py:zeroed_column", "reference": "agent_cases.py:matmul",
               "inputs": "agent_cases.py:inputs", "partition": "column:4", "trials": 48}),
    ("check", {"candidate": "agent_cases.py:matmul", "reference": "agent_cases.py:matmul",
               "inputs": "agent_cases.py:seeded_inputs", "inputs_style": "seed", "trials": 3}),
    ("bench", {"fn": "agent_cases.py:fixed_fast", "vs": "agent_cases.py:fixed_slow", "metric": "return",
               "budget_s": 3.0}),
    ("record", {"workload": "agent_cases.py:spans_workload", "output": "trace.json"}),
    ("analyze", {"trace": "trace.json", "top": 50}),
    ("gil", {"workload": "gil_cases.py:contended_bare"}),
    ("roofline", {"fn": "agent_cases.py:matmul", "inputs": "agent_cases.py:inputs"}),
    ("loadgen", {"base_url": "URL", "num_prompts": 4, "random_input_len": 16, "random_output_len": 4}),
    ("diagnose", {"base_url": "URL", "seconds": 2, "concurrency": 2, "input_len": 16, "output_len": 4,
                  "pyspy": False}),
    ("quality", {"quantization": "w8a8", "windows": 2, "window": 64, "prompts": 2}),
    ("validate_spec", {"spec": "spec.toml"}),
    ("runs", {}),
    ("show", {"run_id": 1}),
    ("ledger_record", {"run_id": 1, "key": "chat/0"}),
    ("evaluate_criteria", {"spec": "spec.toml", "run_id": 1}),
]
BAD = [  # (tool, arguments, words the answer must hold): the error names the cause and the fix
    ("check", {"candidate": "agent_cases.py:matmul", "reference": "agent_cases.py:matmul",
               "inputs": "agent_cases.py:seeded_inputs"}, ["your factory takes (seed, m, k, n)", "inputs_style='seed'"]),
    ("bench", {"fn": "agent_cases.py:matmul", "metric": "speed"}, ["metric 'speed'", "'return'"]),
    ("record", {"workload": "agent_cases.py:failing_workload"},
     ["ValueError in your code at agent_cases.py:", "the workload broke on purpose", "Hint:"]),
    ("gil", {"workload": "gil_cases.py:nope"}, ["no attribute 'nope'", "Hint:"]),
    ("roofline", {"fn": "agent_cases.py:matmul", "inputs": "agent_cases.py:raising_inputs"},
     ["in your code at agent_cases.py:", "in raising_inputs", "a shape does not fit"]),
    ("analyze", {"trace": "not_a_trace.json"}, ["Hint: give a trace"]),
    ("loadgen", {"base_url": "http://127.0.0.1:9", "num_prompts": 2}, ["Hint:"]),
    ("diagnose", {"base_url": "http://127.0.0.1:9", "seconds": 1}, ["nothing answers", "start the server"]),
    ("quality", {"quantization": "w3a3"}, ["w3a3"]),
    ("validate_spec", {"spec": "broken.toml"}, ["ttft_mediam_ms", "Hint:"]),
    ("runs", {"ledger": "../elsewhere.sqlite"}, ["outside the workspace root"]),
    ("show", {"run_id": 99}, ["99"]),
    ("ledger_record", {"run_id": 1, "key": "nope"}, ["no record 'nope'", "see `show`"]),
    ("artifact", {"path": "spec.toml", "key": "target.nope"}, ["Hint:"]),
    ("evaluate_criteria", {"spec": "spec.toml", "run_id": 99}, ["99"]),
]


async def _drive(root: Path, url: str) -> dict:
    params = StdioServerParameters(command=sys.executable, args=["-m", "infragent.cli", "mcp", "--root", str(root)],
                                   env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, cwd=str(root))
    out: dict = {"good": [], "bad": []}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            out["tools"] = {t.name: t for t in (await session.list_tools()).tools}
            for tool, args in GOOD:
                args = {k: (url if v == "URL" else v) for k, v in args.items()}
                result = await session.call_tool(tool, args)
                out["good"].append((tool, result.is_error, result.content[0].text))
                out.setdefault("structured", []).append(result.structured_content)
                out.setdefault("parts", []).append(len(result.content))
            full = json.loads(out["good"][0][2])["full"]
            result = await session.call_tool("artifact", {"path": full, "key": "details.trials.0", "length": 5000})
            out["good"].append(("artifact", result.is_error, result.content[0].text))
            for tool, args, _ in BAD:
                result = await session.call_tool(tool, args)
                out["bad"].append((tool, result.is_error, result.content[0].text))
            first = await session.call_tool("check", {"candidate": "kern.py:mm", "reference": "agent_cases.py:matmul",
                                                      "inputs": "agent_cases.py:inputs", "trials": 2})
            (root / "kern.py").write_text("def mm(x, w):\n    return 2 * (x @ w)\n\ndef added(x, w):\n    return x @ w\n")
            edited = await session.call_tool("check", {"candidate": "kern.py:mm", "reference": "agent_cases.py:matmul",
                                                       "inputs": "agent_cases.py:inputs", "trials": 2})
            added = await session.call_tool("check", {"candidate": "kern.py:added", "reference": "agent_cases.py:matmul",
                                                      "inputs": "agent_cases.py:inputs", "trials": 2})
            out["fresh"] = [json.loads(r.content[0].text)["verdict"] for r in (first, edited, added)]
    return out


def test_every_tool_answers_compactly_and_every_error_with_a_fix(tmp_path):
    root = tmp_path / "work"
    _workspace(root)
    with thread_server() as url:
        out = asyncio.run(_drive(root, url))
    tools = out["tools"]
    expected = {"check", "bench", "record", "gil", "roofline", "analyze", "loadgen", "diagnose", "quality",
                "validate_spec",
                "runs", "show", "ledger_record", "artifact", "evaluate_criteria"}
    assert expected <= set(tools)
    for name in expected:  # schemas an agent can follow: every parameter described, with an example
        schema = tools[name].input_schema
        for param, spec in schema["properties"].items():
            assert spec.get("description") and spec.get("examples"), (name, param)
        assert tools[name].description
    for tool, is_error, text in out["good"]:
        assert not is_error, (tool, text)
        assert len(text.encode()) <= REPLY_LIMIT, (tool, len(text.encode()))
    replies = {tool: text for tool, _, text in out["good"]}
    zeroed = json.loads(out["good"][0][2])
    assert zeroed["verdict"] == "fail" and "column 700 only" in zeroed["finding"] and zeroed["locality"]["shard"] == 2
    assert "values wrong, missing" in zeroed["finding"] and "typical of" not in zeroed["finding"]
    assert all(s is None for s in out["structured"]) and set(out["parts"]) == {1}  # the payload once, as text
    assert zeroed["next_probes"] and all(isinstance(p, dict) and "why" in p for p in zeroed["next_probes"])
    first = zeroed["next_probes"][0]
    assert first["tool"] == "check" and first["arguments"] == {"trials": 200}, zeroed
    assert json.loads(out["good"][1][2])["verdict"] == "pass"  # a seed-style factory, adapted
    bench = json.loads(replies["bench"])
    assert bench["numbers"]["work_rate_ratio"]["value"] > 1  # the figure: benchmarks/agent_feedback.py
    if find_pyspy() is not None:
        gil = json.loads(replies["gil"])
        assert gil["verdict"] != "pass" and gil["locality"]["holder"] == "kv-transfer", gil  # 10/10: test_gil_bare
        assert gil["locality"]["holder_function"].startswith("_pack_block_python")
    assert json.loads(replies["runs"])["runs"][0]["kind"] == "measure"
    assert json.loads(replies["ledger_record"])["probe"] == "loadgen"
    assert json.loads(replies["artifact"])["text"].startswith("{")
    for (tool, is_error, text), (_, _, words) in zip(out["bad"], BAD):
        assert is_error, (tool, text)
        assert "Error executing tool" in text and all(w in text for w in words), (tool, text)
        assert "Traceback" not in text and len(text.encode()) <= REPLY_LIMIT
    assert out["fresh"] == ["pass", "fail", "pass"]  # the edit and the added function are seen, no restart


def test_a_next_probe_keeps_its_positional_argument_as_a_tool_argument():
    from infragent.agent.mcp.server import POSITIONAL, TOOLS
    from infragent.probes.compact import as_tool_calls

    calls = as_tool_calls(["infragent gil jobs.py:run --budget-s 48 (the child's start-up took the budget)",
                           "infragent record WORKLOAD (if several threads share the work)",
                           "infragent analyze trace.json.gz.",
                           "infragent gil on the thread with GIL gaps",
                           "check --trials 200 after the fix"], TOOLS, POSITIONAL)
    assert calls[0] == {"tool": "gil", "arguments": {"workload": "jobs.py:run", "budget_s": 48},
                        "why": calls[0]["why"]}
    assert calls[1]["arguments"] == {"workload": "WORKLOAD"}  # a placeholder, left for the caller to fill
    assert calls[2]["arguments"] == {"trace": "trace.json.gz"}
    assert calls[3]["arguments"] == {} and calls[4]["arguments"] == {"trials": 200}  # words, flags: no positional
