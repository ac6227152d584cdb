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

Every returned row is a probability distribution: a reply whose top-k mass exceeds 1 (a
misconfigured server, duplicated tokens), or holds NaN or positive log-probabilities, is
normalised, never trusted. The server's context length is declared (`max_context`), so
`synthgen.fewshot.generate` refuses, before the charge, a run whose prompts may not fit
(a server would truncate or fail on a private prompt).

Privacy: the server sees the private prompts. Self-host it where the private data may go
(your own machine or enclave), never a third-party API. The DP guarantee covers what is
released from the generated tokens, not what the server logs.
"""

from __future__ import annotations

import copy
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
      max_context: the context length (tokens) the server was started with (e.g. vLLM's
        ``--max-model-len``, llama.cpp's ``-c``); required.
      top_logprobs: k, log-probs per reply (servers cap it, often at 20).
      timeout: seconds per request.

    Privacy:
      The server sees every prompt, private examples included: self-host it. The rows it
      returns are normalised to distributions (`to_vector`), which the sqrt(2)/M
      sensitivity of `synthgen.fewshot` needs.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        max_context: int | None,
        top_logprobs: int = 20,
        timeout: float = 120.0,
    ) -> None:
        if max_context is None or max_context < 2:
            raise ValueError(
                f"max_context (the server's context length) is required, got {max_context=}"
            )
        if top_logprobs < 1:
            raise ValueError(f"top_logprobs must be >= 1, got {top_logprobs=}")
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.tokenizer = model, tokenizer
        self.max_context = int(max_context)
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
        if len(prompt) + 1 > self.max_context:
            # generate() refuses such runs before the charge; this guards direct use.
            raise ValueError(f"a prompt does not fit the server's context {self.max_context}")
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
        """Full-vocabulary log-probs [V] of a distribution from a top-k dict.

        The top-k probabilities are kept and the residual 1 - sum(top-k) is spread
        uniformly over the rest; a reply whose top-k mass exceeds 1 is normalised to sum
        to 1 (NaN or positive log-probabilities count as probability 0 and 1).
        """
        v = self.vocab_size
        known: dict[int, float] = {}
        for token, logprob in top.items():
            token_id = self._token_id(token)
            value = float(logprob)
            if token_id is not None and 0 <= token_id < v and not math.isnan(value):
                known[token_id] = max(known.get(token_id, -math.inf), min(value, 0.0))
        probs = np.zeros(v, np.float64)
        for token_id, logprob in known.items():
            probs[token_id] = math.exp(logprob)
        mass = float(probs.sum())
        rest = v - len(known)
        if mass < 1.0 and rest:
            residual = np.full(v, (1.0 - mass) / rest)
            residual[list(known)] = 0.0
            probs += residual
        total = float(probs.sum())
        probs = probs / total if total > 0 else np.full(v, 1.0 / v)
        with np.errstate(divide="ignore"):
            return np.log(probs).astype(np.float32)

    def score(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        return np.stack([self.to_vector(self._request(list(map(int, p)))) for p in prompts])

    def fork(self) -> OpenAICompletionsLM:
        """The same endpoint with its own session."""
        other = copy.copy(self)
        other._rows = []
        return other

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
