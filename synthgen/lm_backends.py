"""The local backends of `synthgen.next_token.NextTokenLM`, and `load_backend` that picks one.

Backends:
  * `FlaxLM`: the local Flax Llama decoder (`smollm2-135m-instruct` by default, or any
    GGUF / HF Llama checkpoint), all rows batched in one jitted prefill and one jitted
    KV-cache step per token; shapes are bucketed so a session reuses compilations.
  * `synthgen.openai_backend.OpenAICompletionsLM`: an OpenAI-compatible server over HTTP.
  * `TinyLM`: a deterministic byte-level bigram "copy" model for tests.

Log-probabilities are float32 numpy arrays on the host: the DP mechanism runs there
(`synthgen.privacy.mechanisms`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from synthgen.next_token import NextTokenLM, RescoredSession, row_tokens

__all__ = [
    "FlaxLM",
    "NextTokenLM",  # re-exported: where most callers have imported the protocol from
    "TinyLM",
    "continuation_logprobs",
    "load_backend",
    "row_tokens",
]


# ---- a deterministic test model ---------------------------------------------------------


class TinyLM(RescoredSession):
    """Byte-level bigram copy model: p(b | context) ∝ floor + count of (last, b) in context.

    Deterministic and instant, so few-shot behaviour is testable: tokens that follow the
    last token in the prompt's examples are likely, and prompts whose examples agree give
    the same distribution. Vocabulary: 256 bytes, then BOS, EOS, PAD.
    """

    BOS, EOS, PAD = 256, 257, 258

    def __init__(self, floor: float = 1e-3, eos_after_newline: float = 0.0) -> None:
        self.floor = float(floor)
        self.eos_after_newline = float(eos_after_newline)
        self._rows: list[list[int]] = []

    def fork(self) -> TinyLM:
        """The same model with its own session."""
        return TinyLM(self.floor, self.eos_after_newline)

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (self.EOS,)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        return ([self.BOS] if bos else []) + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def _logprobs(self, row: Sequence[int]) -> np.ndarray:
        counts = np.full(self.vocab_size, self.floor)
        counts[[self.BOS, self.PAD]] = 0.0
        ids = np.asarray(row, np.int64)
        if ids.size:
            last = ids[-1]
            following = ids[1:][ids[:-1] == last]
            np.add.at(counts, following, 1.0)
            if last == ord("\n"):
                counts[self.EOS] += self.eos_after_newline
        with np.errstate(divide="ignore"):  # BOS and PAD are never predicted: log 0 = -inf
            return np.log(counts / counts.sum()).astype(np.float32)

    def score(self, prompts: Sequence[Sequence[int]], *, length: int | None = None) -> np.ndarray:
        return np.stack([self._logprobs(p) for p in prompts])  # no shapes: `length` unused


# ---- the local Flax decoder --------------------------------------------------------------


class _TokenizerText:
    """`eos_ids`, `encode` and `decode` of a backend through its local `tokenizer`."""

    tokenizer: Any

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (int(self.tokenizer.eos_id),)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """`text`'s ids, after BOS if `bos` and the tokenizer's model expects one."""
        tok = self.tokenizer
        ids = tok.encode(text)
        use_bos = bos and getattr(tok, "add_bos", False) and tok.bos_id is not None
        return [tok.bos_id, *ids] if use_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


class FlaxLM(_TokenizerText):
    """The local Flax Llama decoder behind `NextTokenLM`, with a batched KV cache.

    A session left-pads its B prompts to a bucketed length (power of two, >= 16),
    prefills them in one jitted call and then runs one jitted cached step per appended
    token for all B rows at once. A one-off `score` pads the batch to
    `synthgen.models.decoding.row_bucket(B)` rows; a session (`start`, `start_documents`)
    uses exactly its rows: its compile is paid once for many steps, and 33 rows step 17%
    faster than 40.
    """

    def __init__(self, config: Any, params: Any, tokenizer: Any) -> None:
        import jax

        from synthgen.models import kv_cache

        # Per-layer weights (split once here) so a jitted step copies none of them.
        self.config, self.tokenizer = config, tokenizer
        self.params = kv_cache.decode_params(params)
        self._cache = None
        self._rows = 0
        self._new_tokens = 0
        self._max_new = 0

        def log_softmax(fn):
            def run(params, cache, *inputs):
                logits, cache = fn(params, cache, *inputs)
                return jax.nn.log_softmax(logits, axis=-1), cache

            return run

        self._prefill = jax.jit(log_softmax(kv_cache.prefill))
        self._step = jax.jit(log_softmax(kv_cache.step), donate_argnums=1)
        self._extend = jax.jit(log_softmax(kv_cache.extend), donate_argnums=1)
        self._raw_extend = jax.jit(kv_cache.extend, donate_argnums=1)

    @classmethod
    def load(cls, name_or_path: str = "smollm2-135m-instruct", dtype: str = "float32") -> FlaxLM:
        """Loads an asset name, a .gguf file or an HF Llama folder (with its tokenizer)."""
        from synthgen.models.llama_loading import load_llama

        config, params, tokenizer = load_llama(name_or_path, dtype=dtype)
        if tokenizer is None:
            raise ValueError(f"{name_or_path} holds no tokenizer")
        return cls(config, params, tokenizer)

    def fork(self) -> FlaxLM:
        """A second handle on the same weights and compiled functions with its own session.

        Lets a caller keep a public prompt's session apart from the private rows' session
        (no shared batch, so no shared numerics) without loading or compiling twice.
        """
        other = copy.copy(self)
        other._cache, other._rows, other._new_tokens, other._max_new = None, 0, 0, 0
        return other

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_context(self) -> int:
        """Most tokens a row may hold (prompt + new tokens)."""
        return self.config.max_seq_len

    def _new_slots(self, longest: int, max_new_tokens: int) -> int:
        """Cache slots for the new tokens: bucketed for compile reuse, within the context."""
        from synthgen.models.decoding import bucket

        room = self.config.max_seq_len - longest
        return max(max_new_tokens, min(bucket(max_new_tokens, 16), room))

    def _prefilled(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        length: int | None = None,
        rows: int | None = None,
    ):
        from synthgen.models import decoding, kv_cache

        if not prompts or min(len(p) for p in prompts) == 0:
            raise ValueError("every prompt needs at least one token")
        longest = max(max(len(p) for p in prompts), length or 0)
        # Bucketed for compile reuse, but never past the context when the exact length fits.
        bucketed = decoding.bucket(longest, decoding.MIN_PROMPT_BUCKET)
        length = max(longest, min(bucketed, self.config.max_seq_len - max_new_tokens))
        decoding.check_context(self.config, length, max_new_tokens)
        rows = rows or decoding.row_bucket(len(prompts))
        ids, mask = decoding.pad_prompts(prompts, length, self.tokenizer.pad_id, rows)
        mask[len(prompts) :, -1] = 1  # padding rows get one token so no row is empty
        cache = kv_cache.init_cache(self.config, rows, length + max_new_tokens)
        return self._prefill(self.params, cache, ids, mask)

    def score(self, prompts: Sequence[Sequence[int]], *, length: int | None = None) -> np.ndarray:
        logprobs, _ = self._prefilled(prompts, 0, length)
        return np.asarray(logprobs[: len(prompts)], np.float32)

    def start(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, length: int | None = None
    ) -> np.ndarray:
        longest = max(max(len(p) for p in prompts), length or 0)
        self._max_new = self._new_slots(longest, max_new_tokens)
        logprobs, self._cache = self._prefilled(prompts, self._max_new, length, len(prompts))
        self._rows, self._new_tokens = len(prompts), 0
        return np.asarray(logprobs[: self._rows], np.float32)

    def document_kv(
        self,
        head: Sequence[int],
        documents: Sequence[Sequence[int]],
        width: int,
        *,
        progress: bool = False,
    ):
        """Every document's keys and values after `head`, computed once
        (`synthgen.models.document_kv`), for `start_documents`."""
        from synthgen.models.document_kv import build_document_kv

        return build_document_kv(
            self.params,
            self.config,
            head,
            documents,
            width,
            extend=self._raw_extend,
            progress=progress,
        )

    def start_documents(
        self, kv, rows: Sequence[int], suffix: Sequence[int], max_new_tokens: int
    ) -> np.ndarray:
        """A session whose row r is ``kv.head + document rows[r] + suffix``: the same
        next-token log-probabilities [len(rows), V] as `start` on those prompts (up to
        float rounding), with only the suffix run. `append` continues it."""
        from synthgen.models.decoding import MIN_PROMPT_BUCKET, bucket, check_context
        from synthgen.models.document_kv import session_cache

        if not len(rows) or not len(suffix):
            raise ValueError("need at least one row and a non-empty suffix")
        if kv.params is not self.params:
            raise ValueError("these keys were computed with other model parameters")
        longest = len(kv.head) + kv.width + len(suffix)
        check_context(self.config, longest, max_new_tokens)
        t = bucket(len(suffix), MIN_PROMPT_BUCKET)
        self._max_new = self._new_slots(longest, max_new_tokens)
        batch = len(rows)
        cache = session_cache(
            kv, self.config, list(rows), batch, len(kv.head) + kv.width + t + self._max_new
        )
        ids = np.full((batch, t), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((batch, t), np.int32)
        ids[:, t - len(suffix) :], mask[:, t - len(suffix) :] = list(suffix), 1
        logprobs, self._cache = self._extend(self.params, cache, ids, mask)
        self._rows, self._new_tokens = len(rows), 0
        return np.asarray(logprobs[: self._rows], np.float32)

    def continuations(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
    ) -> np.ndarray:
        """[prompts, continuations]: each continuation's total log-probability after each
        prompt, from one prefill (a copy of the session's cache per continuation)."""
        import jax
        import jax.numpy as jnp

        if not continuations or min(len(c) for c in continuations) == 0:
            raise ValueError("every continuation needs at least one token")
        first = self.start(prompts, max(len(c) for c in continuations))
        saved = jax.tree.map(jnp.copy, self._cache)  # a step donates the cache it reads
        out = np.zeros((len(prompts), len(continuations)))
        for j, ids in enumerate(continuations):
            self._cache, self._new_tokens = jax.tree.map(jnp.copy, saved), 0
            logprobs = first
            for k, token in enumerate(ids):
                out[:, j] += logprobs[:, token]
                if k + 1 < len(ids):
                    logprobs = self.append(token)
        self._cache, self._new_tokens = saved, 0
        return out

    def append(self, token: int) -> np.ndarray:
        import jax.numpy as jnp

        if self._cache is None:
            raise RuntimeError("append() before start()")
        if self._new_tokens >= self._max_new:
            raise ValueError(f"the session holds at most {self._max_new} new tokens")
        tokens = np.zeros(self._cache.mask.shape[0], np.int32)  # padding rows: unread
        tokens[: self._rows] = row_tokens(token, self._rows)
        tokens = jnp.asarray(tokens)
        logprobs, self._cache = self._step(self.params, self._cache, tokens)
        self._new_tokens += 1
        return np.asarray(logprobs[: self._rows], np.float32)


def load_backend(
    model: str,
    server: str | None = None,
    server_model: str | None = None,
    server_context: int | None = None,
    server_options: dict | None = None,
):
    """The backend a command names: the test LM, the local Flax Llama or a server.

    Args:
      model: "tiny" (the test LM), an asset name, a .gguf file or an HF Llama folder; with
        `server`, only the tokenizer's name.
      server: base URL of an OpenAI-compatible server (it sees every prompt sent to it).
      server_model: the served model's name (default: `model`).
      server_context: the server's context length.
      server_options: further `OpenAICompletionsLM` options.

    Returns:
      (lm, check): `check` is the server's public probe (`ServerCheck`), None locally.
    """
    if server is not None:
        from synthgen.openai_backend import OpenAICompletionsLM

        tokenizer = TinyLM() if model == "tiny" else LocalTokenizer(model)
        remote = OpenAICompletionsLM(
            server,
            server_model or model,
            tokenizer,
            max_context=server_context,
            **(server_options or {}),
        )
        return remote, remote.prepare()  # a public probe, before any charge
    return (TinyLM() if model == "tiny" else FlaxLM.load(model)), None


def continuation_logprobs(
    lm: NextTokenLM, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
) -> np.ndarray:
    """[prompts, continuations]: each continuation's total log-probability after each prompt.

    One prefill where the backend offers it (`FlaxLM.continuations`); else one `score` row
    per continuation prefix.
    """
    own = getattr(lm, "continuations", None)
    if callable(own):
        return own(prompts, continuations)
    rows, spans = [], []
    for prompt in prompts:
        for ids in continuations:
            spans.append(len(rows))
            rows.extend(list(prompt) + list(ids[:j]) for j in range(len(ids)))
    scores = np.asarray(lm.score(rows), np.float64)
    out = np.zeros((len(prompts), len(continuations)))
    k = 0
    for p in range(len(prompts)):
        for c, ids in enumerate(continuations):
            out[p, c] = sum(scores[spans[k] + j][t] for j, t in enumerate(ids))
            k += 1
    return out


class LocalTokenizer(_TokenizerText):
    """The tokenizer of a local Llama asset or folder, for `OpenAICompletionsLM`."""

    def __init__(self, name_or_path: str) -> None:
        from pathlib import Path

        from synthgen import assets
        from synthgen.models.bpe_tokenizer import BpeTokenizer

        path = Path(name_or_path)
        if name_or_path in assets.REGISTRY:
            path = Path(assets.resolve(name_or_path))
        if path.suffix == ".gguf":
            self.tokenizer = BpeTokenizer.from_gguf(path)
        else:
            self.tokenizer = BpeTokenizer.from_pretrained_dir(path)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of the special (control) tokens, EOS among them."""
        added = self.tokenizer.backend.get_added_tokens_decoder()
        return tuple(sorted(i for i, token in added.items() if token.special))
