"""`synthgen lm ...`: run a local Llama-architecture language model (no privacy involved)."""

from __future__ import annotations

import secrets
import sys
import time
from typing import Annotated

import typer

from dpsynth.cli.shared import group_app

lm_app = group_app("Local Llama-architecture language models (GGUF or Hugging Face folders).")


@lm_app.command("generate")
def generate(
    model: Annotated[
        str, typer.Option(help="asset name, .gguf file or Hugging Face folder")
    ] = "smollm2-135m-instruct",
    chat: Annotated[
        str | None, typer.Option(help="user message, rendered with the chat template")
    ] = None,
    prompt: Annotated[str | None, typer.Option(help="raw text to continue")] = None,
    system: Annotated[str | None, typer.Option(help="system message (with --chat)")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="most tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_k: Annotated[int, typer.Option(help="keep the k most likely tokens (0 = all)")] = 0,
    top_p: Annotated[float, typer.Option(help="nucleus mass (1.0 = all)")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="sampling seed (default: OS entropy)")] = None,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16")] = "float32",
    stats: Annotated[bool, typer.Option(help="print timing to stderr")] = False,
) -> None:
    """Generate a continuation of --prompt or an answer to --chat and print it."""
    import jax

    from synthgen.models.decoding import complete
    from synthgen.models.llama_loading import load_llama
    from synthgen.models.sampling import SamplingConfig

    if (chat is None) == (prompt is None):
        raise typer.BadParameter("give exactly one of --chat and --prompt")
    if system is not None and chat is None:
        raise typer.BadParameter("--system needs --chat")
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    start = time.perf_counter()
    config, params, tokenizer = load_llama(model, dtype=dtype)
    if tokenizer is None:
        raise ValueError(f"{model} holds no tokenizer")
    loaded = time.perf_counter()
    if chat is not None:
        messages = [{"role": "system", "content": system}] if system is not None else []
        text = [*messages, {"role": "user", "content": chat}]
    else:
        text = prompt
    key = jax.random.key(secrets.randbits(32) if seed is None else seed)
    (answer,) = complete(
        config,
        params,
        tokenizer,
        [text],
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        key=key,
    )
    print(answer.strip() if chat is not None else answer)
    if stats:
        print(
            f"load {loaded - start:.1f}s, generate {time.perf_counter() - loaded:.1f}s "
            "(including compilation)",
            file=sys.stderr,
        )
