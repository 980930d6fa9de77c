"""The engine's commands: generate, serve, version. Engine knobs become options from the knob registry."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from infragent.cli.common import app, fail
from infragent.engine.knobs import knob_options

@app.command()
@knob_options()
def generate(
    prompts: List[str] = typer.Argument(..., help="One or more prompts."),
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M), hybrid (KDA + attention) or hybrid-moe (with MoE layers)."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0, help="0 means greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 or -1 disables the top-k cut."),
    seed: Optional[int] = typer.Option(None),
    stop: List[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each prompt in the model's chat template."),
    *,
    knobs: dict[str, Any],
) -> None:
    """Print the completion of each prompt (one per line block); errors go to stderr with exit status 2."""
    from infragent.engine.config import ConfigError
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import RequestError, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, stop=list(stop))
    try:
        params.validate()
        llm = LLM(model=model, **knobs)
        if chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        else:
            outputs = llm.generate(list(prompts), params)
        llm.close()
    except (ConfigError, RequestError, FileNotFoundError) as err:
        fail(str(err))
        return
    failed = False
    for out in outputs:
        if out.error:
            typer.echo(f"error: request {out.request_id}: {out.error}", err=True)
            failed = True
        else:
            sys.stdout.write(out.text + "\n")
    sys.stdout.flush()
    if failed:
        raise typer.Exit(2)


@app.command()
@knob_options()
def serve(
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M), hybrid (KDA + attention) or hybrid-moe (with MoE layers)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8000),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name"),
    max_waiting: int = typer.Option(256, "--max-waiting", help="Queued requests beyond this get 429."),
    max_request_bytes: int = typer.Option(4 * 1024 * 1024, "--max-request-bytes",
                                          help="Request bodies larger than this get 413."),
    hybrid_config: Optional[str] = typer.Option(None, "--hybrid-config",
                                                help='JSON sizes for the hybrid model, e.g. \'{"hidden_size": 256}\'.'),
    shutdown_timeout: float = typer.Option(30.0, "--shutdown-timeout", help="Seconds in-flight requests get on SIGTERM."),
    disagg: bool = typer.Option(False, "--disagg", help="Disaggregate: a router, prefill and decode worker "
                                "processes, KV through a store (layer-wise with --kv-transfer-mode)."),
    prefill_workers: int = typer.Option(1, "--prefill-workers", help="--disagg: prefill worker processes."),
    decode_workers: int = typer.Option(1, "--decode-workers", help="--disagg: decode worker processes."),
    kv_store: str = typer.Option("shm", "--kv-store", help="--disagg: shm (shared memory) or tcp."),
    transfer_timeout: float = typer.Option(60.0, "--transfer-timeout", help="--disagg: seconds a request may "
                                           "spend in prefill + KV transfer, in waiting for admission, or "
                                           "between two tokens before it fails."),
    profile_dir: Optional[str] = typer.Option(None, "--profile-dir", help="Take torch.profiler traces of the "
                                              "engine's steps on POST /start_profile and /stop_profile (as vLLM "
                                              "and SGLang), written here as gzipped Kineto JSON."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved engine config as JSON "
                                      "and exit, without loading the model."),
    *,
    knobs: dict[str, Any],
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API."""
    import json
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")

    from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
    from infragent.engine.disagg.router import DisaggConfig
    from infragent.engine.server.serve import make_server

    try:
        hybrid = HybridConfig(**json.loads(hybrid_config)) if hybrid_config else HybridConfig()
        config = EngineConfig(model=model, hybrid=hybrid, **knobs)
        if print_config:
            typer.echo(config.to_json())
            return
        import infragent

        logging.getLogger("infragent.serve").info("engine config: %s", config.to_json())
        logging.getLogger("infragent.serve").info("engine code: %s", Path(infragent.__file__).resolve().parent)
        split = (DisaggConfig(prefill_workers, decode_workers, kv_store, transfer_timeout) if disagg else None)
        server = make_server(config, host, port, api_key, max_waiting, shutdown_timeout, served_model_name,
                             log_level="info", disagg=split, max_request_bytes=max_request_bytes,
                             profile_dir=profile_dir)
    except (ConfigError, FileNotFoundError) as err:
        fail(str(err))
        return
    except (json.JSONDecodeError, TypeError) as err:
        fail(f"--hybrid-config: {err}; give a JSON object of HybridConfig fields")
        return
    server.run()


@app.command()
def version() -> None:
    """Print the infragent version."""
    from infragent import __version__

    typer.echo(__version__)
