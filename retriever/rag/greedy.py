"""Non-private greedy decoding of one prompt: the references, and post-processing of
released text (a knowledge release, released keywords)."""

from __future__ import annotations

import numpy as np


def greedy_answer(lm, prompt_ids: list[int], max_tokens: int) -> str:
    """The greedy continuation of `prompt_ids`, at most `max_tokens` tokens, stripped."""
    tokens: list[int] = []
    logprobs = lm.start([prompt_ids], max_tokens)
    for _ in range(max_tokens):
        token = int(np.argmax(logprobs[0]))
        if token in lm.eos_ids:
            break
        tokens.append(token)
        if len(tokens) < max_tokens:
            logprobs = lm.append(token)
    return lm.decode(tokens).strip()
