"""`NextTokenLM` over an OpenAI-compatible completions server (vLLM, llama.cpp server).

Each prompt (token ids, tokenised locally with the served model's tokenizer) is sent to
``POST {base_url}/completions`` with ``max_tokens=1`` and ``logprobs=k``; the reply's top-k
log-probabilities become a full-vocabulary vector.

Lossy by construction: the server returns only the top-k tokens. Their log-probabilities are
kept; the residual mass 1 - sum(top-k) is spread uniformly over the rest of the vocabulary.
Returned token strings are mapped back to ids by the local tokenizer (vLLM's
``token_id:<n>`` form is read directly); a string that is not exactly one token of the
local vocabulary is dropped into the residual. Servers keep no session: every step re-sends
prompt + generated tokens (servers with prefix caching, e.g. vLLM, make this cheap).

Privacy: the server sees the private prompts. Run it where the private data may go (your
own machine or enclave), never a third-party API.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np


class OpenAICompletionsLM:
    """An OpenAI-compatible completions endpoint behind the `NextTokenLM` protocol.

    Args:
      base_url: e.g. ``http://localhost:8000/v1``.
      model: the served model's name.
      tokenizer: an object with ``encode``, ``decode``, ``vocab_size`` and ``eos_ids``
        matching the served model (e.g. a `FlaxLM`-free `LocalTokenizer`).
      top_logprobs: k, log-probs per reply (servers cap it, often at 20).
      timeout: seconds per request.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        top_logprobs: int = 20,
        timeout: float = 120.0,
    ) -> None:
        if top_logprobs < 1:
            raise ValueError(f"top_logprobs must be >= 1, got {top_logprobs=}")
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.tokenizer = model, tokenizer
        self.top_logprobs, self.timeout = top_logprobs, timeout
        self._rows: list[list[int]] = []

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.eos_ids)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        return self.tokenizer.encode(text, bos=bos)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def _token_id(self, token: str) -> int | None:
        if token.startswith("token_id:"):
            return int(token.split(":", 1)[1])
        ids = self.tokenizer.encode(token)
        return ids[0] if len(ids) == 1 else None

    def _request(self, prompt: list[int]) -> dict[str, float]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": self.top_logprobs,
        }
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            reply = json.load(response)
        try:
            return reply["choices"][0]["logprobs"]["top_logprobs"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError("the server's reply has no choices[0].logprobs.top_logprobs") from exc

    def to_vector(self, top: dict[str, float]) -> np.ndarray:
        """Full-vocabulary log-probs [V] from a top-k dict (residual spread uniformly)."""
        v = self.vocab_size
        known: dict[int, float] = {}
        for token, logprob in top.items():
            token_id = self._token_id(token)
            if token_id is not None and 0 <= token_id < v:
                known[token_id] = max(known.get(token_id, -math.inf), float(logprob))
        mass = sum(math.exp(lp) for lp in known.values())
        rest = v - len(known)
        fill = math.log(max(1.0 - mass, 1e-12) / rest) if rest else -math.inf
        out = np.full(v, fill, np.float64)
        for token_id, logprob in known.items():
            out[token_id] = logprob
        return out.astype(np.float32)

    def score(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        return np.stack([self.to_vector(self._request(list(map(int, p)))) for p in prompts])

    def start(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> np.ndarray:
        self._rows = [list(p) for p in prompts]
        return self.score(self._rows)

    def append(self, token: int) -> np.ndarray:
        for row in self._rows:
            row.append(int(token))
        return self.score(self._rows)


class LocalTokenizer:
    """The tokenizer of a local Llama asset or folder, for `OpenAICompletionsLM`."""

    def __init__(self, name_or_path: str) -> None:
        from pathlib import Path

        from synthgen import assets
        from synthgen.models.bpe_tokenizer import BpeTokenizer

        path = Path(name_or_path)
        if name_or_path in assets.REGISTRY:
            path = Path(assets.resolve(name_or_path))
        if path.suffix == ".gguf":
            self._tok = BpeTokenizer.from_gguf(path)
        else:
            self._tok = BpeTokenizer.from_pretrained_dir(path)

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (int(self._tok.eos_id),)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        ids = self._tok.encode(text)
        use_bos = bos and self._tok.add_bos and self._tok.bos_id is not None
        return [self._tok.bos_id, *ids] if use_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))
