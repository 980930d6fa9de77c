"""Where probes keep their raw artifacts (samples, traces), so every verdict points at hashed evidence."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from infragent.probes.feedback import Evidence


ENV = "INFRAGENT_ARTIFACTS"


def artifact_dir() -> Path:
    """$INFRAGENT_ARTIFACTS, or .infragent/artifacts under the working directory; always absolute (a relative
    $INFRAGENT_ARTIFACTS is taken from the working directory), so a path handed on stays valid elsewhere."""
    path = Path(os.environ.get(ENV) or Path.cwd() / ".infragent" / "artifacts").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def export_artifact_dir() -> Path:
    """Fix artifact_dir() for this process and the children it starts (whatever folder they run in): set
    $INFRAGENT_ARTIFACTS to its absolute path. Call once where a command starts, before changing folders."""
    path = artifact_dir()
    os.environ[ENV] = str(path)
    return path


def save_json(probe: str, data: Any, description: str) -> Evidence:
    """Write data as JSON to a fresh file named after the probe and the time; return it as Evidence."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = artifact_dir() / f"{probe}-{stamp}-{time.perf_counter_ns() % 1_000_000:06d}.json"
    path.write_text(json.dumps(data))
    return Evidence.of(path, description)
