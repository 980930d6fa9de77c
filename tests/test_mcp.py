"""`infragent mcp`: a client from the official SDK lists the tools and runs a probe over stdio; paths
outside the workspace root are refused."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SRC = Path(__file__).resolve().parent.parent / "src"


def _trace(path: Path) -> None:
    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "engine"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "kv-transfer"}}]
    for k in range(6):
        events += [{"ph": "X", "name": "compute", "pid": 1, "tid": 1, "ts": 100 * k, "dur": 60},
                   {"ph": "X", "name": "kv.transfer", "pid": 1, "tid": 2, "ts": 100 * k + 60, "dur": 30}]
    path.write_text(json.dumps({"traceEvents": events}))


async def _session(root: Path) -> tuple[list[str], dict, object]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "infragent.cli", "mcp", "--root", str(root)],
                                   env={"PYTHONPATH": str(SRC)}, cwd=str(root))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            result = await session.call_tool("analyze_trace", {"trace": "t.json", "overlap_a": "kv.transfer",
                                                               "overlap_b": "compute"})
            escaped = await session.call_tool("analyze_trace", {"trace": "../outside.json"})
            return tools, json.loads(result.content[0].text), escaped


def test_client_lists_tools_runs_a_probe_and_path_traversal_is_rejected(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    _trace(root / "t.json")
    _trace(tmp_path / "outside.json")
    tools, feedback, escaped = asyncio.run(_session(root))
    assert {"analyze_trace", "check", "bench", "roofline", "list_runs", "show_run", "evaluate_criteria",
            "validate_spec"} <= set(tools)
    assert feedback["probe"] == "analyze" and feedback["verdict"] == "fail"  # the pair never overlaps
    assert "kv-transfer" in feedback["finding"]
    assert escaped.is_error and "outside the workspace root" in escaped.content[0].text
