"""The infragent command line (one typer app)."""
from __future__ import annotations

import sys
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="infragent: an infrastructure agent for LLM inference, and the engine it tunes.")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def generate(
    prompts: List[str] = typer.Argument(..., help="One or more prompts."),
    model: str = typer.Option("llama", help="Model family: llama (SmolLM2-135M) or hybrid (KDA + attention)."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0, help="0 means greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 or -1 disables the top-k cut."),
    seed: Optional[int] = typer.Option(None),
    stop: List[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    chat: bool = typer.Option(False, "--chat", help="Wrap each prompt in the model's chat template."),
    max_num_seqs: int = typer.Option(32, "--max-num-seqs"),
    max_num_batched_tokens: int = typer.Option(512, "--max-num-batched-tokens"),
    block_size: int = typer.Option(16, "--block-size"),
    dtype: str = typer.Option("float32"),
    threads: Optional[int] = typer.Option(None, "--threads"),
) -> None:
    """Print the completion of each prompt (one per line block); errors go to stderr with exit status 2."""
    from infragent.engine.config import ConfigError
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import RequestError, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            seed=seed, stop=list(stop))
    try:
        params.validate()
        llm = LLM(model=model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  block_size=block_size, dtype=dtype, num_threads=threads)
        if chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        else:
            outputs = llm.generate(list(prompts), params)
    except (ConfigError, RequestError, FileNotFoundError) as err:
        _fail(str(err))
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
def version() -> None:
    """Print the infragent version."""
    from infragent import __version__

    typer.echo(__version__)


if __name__ == "__main__":
    app()
