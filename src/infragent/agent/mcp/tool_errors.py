"""Errors as answers: what an agent calling a tool gets back when the call fails — one short message that
says what was wrong, where in the user's code it happened (file:line and function, not the source lines),
and how to fix it. A traceback only when asked for (`infragent mcp --tracebacks`).
"""
from __future__ import annotations

import traceback
from pathlib import Path

import infragent
from infragent.engine.config import ConfigError
from infragent.lab.spec import SpecError
from infragent.probes.bench import BenchError
from infragent.probes.callables import CallableError
from infragent.probes.inputs import InputsError
from infragent.probes.partition import PartitionError
from infragent.trace_model import TraceFormatError

MESSAGE_CHARS = 700
HINTS = {  # by exception type: what to do next (a user error infragent names itself carries its own fix)
    CallableError: "name a callable as module:function (importable from the workspace root) or path/file.py:function",
    InputsError: "",
    PartitionError: "partitions look like column:4, row:4, heads:4:dim=1, splitk:4 or batch:2",
    TraceFormatError: "give a trace infragent wrote (record), a Chrome trace JSON or a torch profiler (Kineto) "
                      "export, .json or .json.gz",
    SpecError: "fix the field named, then run validate_spec again",
    BenchError: "",
    ConfigError: "",
}
OTHER_HINTS = [  # (type, hint) for errors outside the user's code that name no fix themselves
    (ConnectionError, "nothing answered at that address: start the server, or fix base_url (http://HOST:PORT)"),
    (FileNotFoundError, "no such file: paths are relative to the workspace root"),
    (KeyError, "that key is not there: read the artifact without a key first to see what it holds"),
    (IndexError, "that index is out of range: read the artifact without a key first to see what it holds"),
    (ValueError, "check the value named against the tool's description"),
]
USER_HINTS = [  # (type name, words in the message, the hint) for exceptions raised inside the user's code
    ("TypeError", "argument", "the arguments infragent passed do not fit the function: check the inputs factory "
                              "returns what the function takes (a tuple of positional arguments or a dict of "
                              "keyword arguments)"),
    ("RuntimeError", "shape", "a shape does not fit: check the shapes the inputs factory draws"),
    ("RuntimeError", "size", "a shape does not fit: check the shapes the inputs factory draws"),
    ("ModuleNotFoundError", "", "the module imports something this Python cannot find: install it, or run the "
                                "server from the folder that has it"),
    ("AssertionError", "", "an assertion in your code failed on the inputs given"),
]


def explain(err: BaseException, root: Path, tool: str, tracebacks: bool = False) -> str:
    """The answer for a failed tool call: the error, where in the user's code, and a fix hint."""
    kind = type(err).__name__
    message = str(err).strip() or kind
    known = next((hint for cls, hint in HINTS.items() if isinstance(err, cls)), None)
    if known is not None:
        text = message if not known else f"{message}. Hint: {known}"
    else:
        where = user_frame(err, root)
        if where:
            hint = next((h for name, words, h in USER_HINTS if kind == name and words in message.lower()),
                        "fix the cause in your code, or call the tool with other arguments")
            text = f"{tool}: {kind} in your code at {where}: {message}. Hint: {hint}"
        else:
            hint = next((h for cls, h in OTHER_HINTS if isinstance(err, cls)),
                        "check the arguments against the tool's description")
            text = f"{tool}: {kind}: {message}. Hint: {hint}"
    text = text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"
    if tracebacks:
        text += "\n" + "".join(traceback.format_exception(err))[-4000:]
    return text


def user_frame(err: BaseException, root: Path) -> str:
    """'path/in/root.py:LINE in function' for the innermost frame of the traceback inside root (the user's
    code, not infragent's own), or ''."""
    root, ours = root.resolve(), Path(infragent.__file__).resolve().parent
    found = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename.startswith("<"):  # generated code (a dataclass's __init__): nobody's file
            continue
        path = Path(frame.filename).resolve()
        if path.is_relative_to(root) and not path.is_relative_to(ours) and "site-packages" not in path.parts:
            found = f"{path.relative_to(root)}:{frame.lineno} in {frame.name}"
    return found
