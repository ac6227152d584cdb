"""Keys and values of a fixed document collection, computed once, reused by every prompt.

A DP-RAG answer runs one private prompt per document: ``head + document + question``,
where the head (system instruction) and the documents do not depend on the question. Their
keys and values are therefore computed once per collection (`build_document_kv`) and an
answer only feeds the question after them (`session_cache` then `llama.extend`): the
prefill of ``B x (head + document + question)`` tokens becomes one of ``B x question``.

Layout of a session's cache: slots ``[0, H)`` hold the shared head, ``[H, H + W)`` each
row's document (right-padded to the public width W: the padding slots are masked and never
attended), then the question and the generated tokens. RoPE positions are per row, so a
row decodes as its unpadded prompt would from one `llama.prefill` (up to float rounding).

Privacy: every document's keys are computed before any answer and an answer gathers a
fixed number of rows of width W, so its work and memory do not depend on which documents
it reads (Privacy rule 9); a cache filled on first use would time which documents were
read before.

Memory: ``2 x L x N x W x K x D`` floats (SmolLM2-135M, W = 64: about 3 MB per document in
float32), held on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from synthgen.models import llama


@dataclasses.dataclass(frozen=True)
class DocumentKV:
    """A head's and every document's keys and values (host arrays, config dtype).

    Attributes:
      head: the head's token ids (H).
      head_k: the head's rotated keys [L, H, K, D]; head_v its values.
      k: every document's rotated keys after the head [L, N, W, K, D]; v their values.
      lengths: int [N], each document's number of tokens (<= W).
    """

    head: tuple[int, ...]
    head_k: np.ndarray
    head_v: np.ndarray
    k: np.ndarray
    v: np.ndarray
    lengths: np.ndarray

    @property
    def width(self) -> int:
        """W, the public number of slots of every document."""
        return self.k.shape[2]

    @property
    def documents(self) -> int:
        return self.k.shape[1]


def build_document_kv(
    params,
    config: llama.LlamaConfig,
    head: Sequence[int],
    documents: Sequence[Sequence[int]],
    width: int,
    *,
    extend=None,
    batch: int = 32,
    progress: bool = False,
) -> DocumentKV:
    """Runs the head once, then every document after it, `batch` documents per call.

    Args:
      params, config: the decoder.
      head: token ids before each document (at least one).
      documents: token ids of each document; each is cut to its first `width` ids.
      width: W, the public number of slots per document.
      extend: a jitted `llama.extend` to reuse (compiled once per shape).
      batch: documents per call (a public shape).
      progress: a progress bar over the documents.
    """
    import jax

    if not head:
        raise ValueError("the head needs at least one token")
    if width < 1 or not documents:
        raise ValueError(f"need width >= 1 and at least one document: {width=}")
    extend = extend or jax.jit(llama.extend)
    h, n = len(head), len(documents)
    cache = llama.init_cache(config, 1, h)
    _, cache = jax.jit(llama.prefill)(
        params, cache, np.array([head], np.int32), np.ones((1, h), np.int32)
    )
    head_k, head_v = np.asarray(cache.k[:, 0]), np.asarray(cache.v[:, 0])
    shape = (config.num_layers, n, width, config.num_kv_heads, config.head_dim)
    k, v = np.zeros(shape, head_k.dtype), np.zeros(shape, head_v.dtype)
    lengths = np.array([min(len(d), width) for d in documents], np.int32)
    starts = range(0, n, batch)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="document keys", unit="batch")
    for start in starts:
        chunk = documents[start : start + batch]
        ids = np.zeros((batch, width), np.int32)
        mask = np.zeros((batch, width), np.int32)
        for r, doc in enumerate(chunk):
            doc = list(doc)[:width]
            ids[r, : len(doc)], mask[r, : len(doc)] = doc, 1
        filled = _headed_cache(config, head_k, head_v, batch, h + width)
        _, filled = extend(params, filled, ids, mask)
        rows = len(chunk)
        k[:, start : start + rows] = np.asarray(filled.k[:, :rows, h:])
        v[:, start : start + rows] = np.asarray(filled.v[:, :rows, h:])
    return DocumentKV(tuple(int(t) for t in head), head_k, head_v, k, v, lengths)


def _headed_cache(config, head_k, head_v, rows: int, slots: int) -> llama.KVCache:
    """A cache of `rows` rows and `slots` slots whose first slots hold the head."""
    import jax.numpy as jnp

    h = head_k.shape[1]
    shape = (config.num_layers, rows, slots, config.num_kv_heads, config.head_dim)
    k, v = np.zeros(shape, head_k.dtype), np.zeros(shape, head_v.dtype)
    k[:, :, :h], v[:, :, :h] = head_k[:, None], head_v[:, None]
    mask = np.zeros((rows, slots), bool)
    mask[:, :h] = True
    return llama.KVCache(
        k=jnp.asarray(k),
        v=jnp.asarray(v),
        mask=jnp.asarray(mask),
        positions=jnp.full((rows,), h, jnp.int32),
        index=jnp.asarray(h, jnp.int32),
        config=config,
    )


def session_cache(
    kv: DocumentKV, config: llama.LlamaConfig, rows: Sequence[int], batch: int, slots: int
) -> llama.KVCache:
    """A decoding cache of `batch` rows whose row r holds the head and document rows[r]
    (rows past ``len(rows)`` repeat document rows[0]; their outputs are for no one), with
    `slots` slots in all; the next block goes into slot H + W.

    The same gather of `batch` rows of width W whichever documents are named."""
    import jax.numpy as jnp

    h, w = len(kv.head), kv.width
    if slots < h + w + 1:
        raise ValueError(f"need more than H + W = {h + w} slots, got {slots}")
    index = np.zeros(batch, np.int64)
    index[: len(rows)] = rows
    index[len(rows) :] = rows[0]
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    k, v = np.zeros(shape, kv.k.dtype), np.zeros(shape, kv.v.dtype)
    k[:, :, :h], v[:, :, :h] = kv.head_k[:, None], kv.head_v[:, None]
    k[:, :, h : h + w], v[:, :, h : h + w] = kv.k[:, index], kv.v[:, index]
    lengths = kv.lengths[index]
    mask = np.zeros((batch, slots), bool)
    mask[:, :h] = True
    mask[:, h : h + w] = np.arange(w)[None] < lengths[:, None]
    return llama.KVCache(
        k=jnp.asarray(k),
        v=jnp.asarray(v),
        mask=jnp.asarray(mask),
        positions=jnp.asarray(h + lengths, jnp.int32),
        index=jnp.asarray(h + w, jnp.int32),
        config=config,
    )
