"""Text from public prompts: the LM calls of Private Evolution, batched.

The LM sees public prompts only, so any backend and sampling may be used. Both samplers
have `sample(prompts, key) -> texts`: `FlaxSampler` (the local Flax Llama, whole batches
through `synthgen.models.decoding.generate`, chat template when there is one) and
`NextTokenSampler` (any `NextTokenLM`: one batched `score` per token, host-side draws).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class TextSampler(Protocol):
    """Samples one continuation per public prompt."""

    def sample(self, prompts: Sequence[str], seed: int) -> list[str]: ...


def clean_text(text: str) -> str:
    """A generated sample without a chat preamble ("Sure, here is ...:") or wrapping quotes."""
    text = text.strip()
    lines = text.split("\n")
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):
        text = "\n".join(lines[1:]).strip()
    return text.strip('"').strip()


@dataclasses.dataclass(kw_only=True, eq=False)
class _BatchedSampler:
    """The options both samplers take: `lm`, tokens per sample, temperature, top-p, batch."""

    lm: Any = dataclasses.field(kw_only=False)
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 0.95
    batch_size: int = 32


class FlaxSampler(_BatchedSampler):
    """Batched KV-cache sampling with the local Flax Llama (options: `_BatchedSampler`'s)."""

    def __init__(self, lm, *, chat: bool = True, max_prompt_tokens: int = 384, **options) -> None:
        from synthgen.models.sampling import SamplingConfig

        super().__init__(lm, **options)
        self.sampling = SamplingConfig(temperature=self.temperature, top_p=self.top_p)
        self.chat = chat and getattr(lm.tokenizer, "chat_template", None) is not None
        self.max_prompt_tokens = max_prompt_tokens

    def _ids(self, prompt: str) -> list[int]:
        tokenizer = self.lm.tokenizer
        if self.chat:
            ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
        else:
            ids = self.lm.encode(prompt, bos=True)
        return ids[-self.max_prompt_tokens :]

    def sample(self, prompts: Sequence[str], seed: int) -> list[str]:
        import jax

        from synthgen.models.decoding import generate

        key = jax.random.key(seed)
        out: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = [self._ids(p) for p in prompts[start : start + self.batch_size]]
            ids = generate(
                self.lm.config,
                self.lm.params,
                batch,
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                key=jax.random.fold_in(key, start),
                eos_id=self.lm.eos_ids,
                pad_id=self.lm.tokenizer.pad_id,
                # a short last batch: the full batches' program
                min_rows=min(self.batch_size, len(prompts)),
            )
            out.extend(clean_text(self.lm.decode(row)) for row in ids)
        return out


class NextTokenSampler(_BatchedSampler):
    """Sampling through any `NextTokenLM`: one batched `score` per token, host-side draws."""

    def _pick(self, logprobs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.temperature == 0:
            return np.argmax(logprobs, axis=1)
        logits = logprobs.astype(np.float64) / self.temperature
        logits -= logits.max(1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(1, keepdims=True)
        order = np.argsort(-probs, axis=1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, 1)
        keep = (np.cumsum(sorted_p, 1) - sorted_p) < self.top_p
        sorted_p = np.where(keep, sorted_p, 0.0)
        sorted_p /= sorted_p.sum(1, keepdims=True)
        u = rng.random((len(probs), 1))
        picks = np.minimum((np.cumsum(sorted_p, 1) < u).sum(1), probs.shape[1] - 1)
        return order[np.arange(len(probs)), picks]

    def sample(self, prompts: Sequence[str], seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        eos = set(self.lm.eos_ids)
        out: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            rows = [self.lm.encode(p, bos=True) for p in prompts[start : start + self.batch_size]]
            new: list[list[int]] = [[] for _ in rows]
            live = list(range(len(rows)))
            for _ in range(self.max_new_tokens):
                if not live:
                    break
                tokens = self._pick(self.lm.score([rows[i] + new[i] for i in live]), rng)
                still = []
                for i, token in zip(live, tokens.tolist(), strict=True):
                    if token in eos:
                        continue
                    new[i].append(token)
                    still.append(i)
                live = still
            out.extend(clean_text(self.lm.decode(ids)) for ids in new)
        return out


def make_sampler(lm, **options) -> TextSampler:
    """`FlaxSampler` for the local Flax Llama, `NextTokenSampler` for any other backend."""
    from synthgen.lm_backends import FlaxLM

    if isinstance(lm, FlaxLM):
        return FlaxSampler(lm, **options)
    options.pop("chat", None)
    return NextTokenSampler(lm, **options)
