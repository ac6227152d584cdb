"""Batched autoregressive decoding for `synthgen.models.llama` with a KV cache.

One jitted program per shape bucket: prompts are left-padded to a bucketed length (a power of
two, at least 16), the batch is padded with inactive rows (`row_bucket`, at least a caller's
`min_rows`), and the cache and output buffer are sized for a bucketed number of new tokens
while the actual limit is a traced value, so calls with similar shapes reuse one compilation.
Inside the program the prompts are prefilled once, then a `lax.while_loop` steps every row
one token at a time and stops when all rows have emitted EOS or the limit is reached; no
Python loop runs per token.
Step i samples with ``fold_in(key, i)``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from synthgen.models import kv_cache
from synthgen.models.llama import LlamaConfig
from synthgen.models.sampling import SamplingConfig, sample_next
from synthgen.models.tokenizer import Tokenizer

PyTree = Any
MIN_PROMPT_BUCKET = 16


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def row_bucket(n: int) -> int:
    """Rows of a batch of `n` prompts: a power of two up to 8, then a multiple of 8.

    Powers of two all the way up padded 33 rows to 64 and doubled the work
    (scripts/bench_decode.py); multiples of 8 waste at most 7 rows for a few more shapes.
    """
    return bucket(n) if n <= 8 else -(-n // 8) * 8


def check_context(config: LlamaConfig, length: int, max_new_tokens: int) -> None:
    """ValueError unless `length` prompt tokens and `max_new_tokens` fit the context."""
    if length + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prompt + new tokens exceed the context: {length=} + {max_new_tokens=} > "
            f"{config.max_seq_len=}"
        )


def pad_prompts(prompts: Sequence[Sequence[int]], length: int, pad_id: int, rows: int):
    """Left-pads `prompts` into int32 ids and a 0/1 mask of shape [rows, length]."""
    ids = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), np.int32)
    for r, prompt in enumerate(prompts):
        if len(prompt):
            ids[r, length - len(prompt) :] = prompt
            mask[r, length - len(prompt) :] = 1
    return ids, mask


@functools.partial(jax.jit, static_argnames=("config", "sampling", "max_new_bucket"))
def _generate_padded(
    params: PyTree,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    active: jax.Array,
    key: jax.Array,
    eos_ids: jax.Array,
    pad_id: jax.Array,
    max_new_tokens: jax.Array,
    *,
    config: LlamaConfig,
    sampling: SamplingConfig,
    max_new_bucket: int,
) -> tuple[jax.Array, jax.Array]:
    """Generated ids [B, max_new_bucket] (pad after EOS) and the number of steps run."""
    b, t = input_ids.shape
    params = kv_cache.decode_params(params)  # once, not inside the loop
    cache = kv_cache.init_cache(config, b, t + max_new_bucket)
    logits, cache = kv_cache.prefill(params, cache, input_ids, attention_mask)

    def pick(logits, i, done):
        token = sample_next(logits, jax.random.fold_in(key, i), sampling)
        token = jnp.where(done, pad_id, token)
        return token, done | jnp.isin(token, eos_ids)

    token, done = pick(logits, 0, ~active)
    out = jnp.full((b, max_new_bucket), pad_id, jnp.int32).at[:, 0].set(token)

    def cond(state):
        i, _, _, done, _ = state
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(state):
        i, cache, token, done, out = state
        logits, cache = kv_cache.step(params, cache, token)
        token, done = pick(logits, i, done)
        out = jax.lax.dynamic_update_slice(out, token[:, None], (jnp.zeros((), i.dtype), i))
        return i + 1, cache, token, done, out

    state = (jnp.ones((), jnp.int32), cache, token, done, out)
    steps, _, _, _, out = jax.lax.while_loop(cond, body, state)
    return out, steps


def generate(
    config: LlamaConfig,
    params: PyTree,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    key: jax.Array | None,
    eos_id: int | Sequence[int],
    pad_id: int,
    min_rows: int = 1,
) -> list[list[int]]:
    """Continues each prompt by up to `max_new_tokens` tokens.

    Args:
      config: the model config.
      params: the model parameters (``params`` collection, not the variables dict).
      prompts: token ids per prompt (BOS included if the model needs it); lengths may differ.
      max_new_tokens: most tokens to generate per prompt.
      sampling: greedy (temperature 0) or temperature / top-k / top-p sampling.
      key: PRNG key of the sampling; may be None only for greedy decoding.
      eos_id: id (or ids) that end a row.
      pad_id: id used for padding (never attended to).
      min_rows: run at least this many rows (inactive ones padded): a caller that cuts a
        job into batches of `min_rows` passes it so that a short last batch runs the
        compiled program of the full ones (when its prompts fall in the same length bucket)
        instead of compiling its own.

    Returns:
      The generated ids of each prompt, without the EOS token and anything after it.

    Raises:
      ValueError: empty batch or prompt, or prompt + new tokens longer than the model's
        ``max_seq_len``.
    """
    if not prompts:
        raise ValueError("no prompts to generate from")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens=}")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ValueError("every prompt needs at least one token (e.g. BOS)")
    check_context(config, max(lengths), max_new_tokens)
    if key is None:
        if not sampling.greedy:
            raise ValueError("sampling with temperature > 0 needs a PRNG key")
        key = jax.random.key(0)
    eos_ids = [int(eos_id)] if isinstance(eos_id, int | np.integer) else [int(e) for e in eos_id]
    rows = row_bucket(max(len(prompts), min_rows))
    ids, mask = pad_prompts(prompts, bucket(max(lengths), MIN_PROMPT_BUCKET), pad_id, rows)
    active = np.arange(rows) < len(prompts)
    mask[~active, -1] = 1  # inactive rows get one (pad) token so no row is empty
    out, _ = _generate_padded(
        params,
        ids,
        mask,
        active,
        key,
        jnp.asarray(eos_ids, jnp.int32),
        jnp.asarray(pad_id, jnp.int32),
        jnp.asarray(max_new_tokens, jnp.int32),
        config=config,
        sampling=sampling,
        max_new_bucket=bucket(max_new_tokens),
    )
    out = np.asarray(out)[: len(prompts), :max_new_tokens]
    results = []
    for row in out.tolist():
        ends = [i for i, token in enumerate(row) if token in eos_ids]
        results.append(row[: ends[0]] if ends else row)
    return results


def complete(
    config: LlamaConfig,
    params: PyTree,
    tokenizer: Tokenizer,
    texts: Sequence[str | Sequence[Mapping[str, str]]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    key: jax.Array | None,
) -> list[str]:
    """Text in, text out: plain prompts (str) or chat conversations (lists of messages).

    Conversations are rendered with the tokenizer's chat template (`apply_chat_template`,
    with the assistant header); plain prompts get BOS first when the tokenizer asks for it.
    """
    prompts = []
    add_bos = getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None
    for text in texts:
        if isinstance(text, str):
            ids = tokenizer.encode(text)
            prompts.append([tokenizer.bos_id, *ids] if add_bos else ids)
        else:
            encode_chat = getattr(tokenizer, "encode_chat", None)
            if encode_chat is None:
                raise ValueError("this tokenizer has no chat template; pass plain text")
            prompts.append(encode_chat(text))
    outs = generate(
        config,
        params,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        key=key,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    return [tokenizer.decode(o) for o in outs]
