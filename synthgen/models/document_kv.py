"""Keys and values of a fixed document collection, computed once, reused by every prompt.

A DP-RAG answer runs one private prompt per document: ``head + document + question``,
where the head (system instruction) and the documents do not depend on the question. Their
keys and values are therefore computed once per collection (`build_document_kv`) and an
answer only feeds the question after them (`session_cache` then `kv_cache.extend`): the
prefill of ``B x (head + document + question)`` tokens becomes one of ``B x question``.

Layout of a session's cache: slots ``[0, H)`` hold the shared head, ``[H, H + W)`` each
row's document (right-padded to the public width W: the padding slots are masked and never
attended), then the question and the generated tokens. RoPE positions are per row, so a
row decodes as its unpadded prompt would from one `kv_cache.prefill` (up to float rounding).

Privacy: every document's keys are computed before any answer and an answer gathers a
fixed number of rows of width W, so its work and memory do not depend on which documents
it reads (Privacy rule 9); a cache filled on first use would time which documents were
read before.

Not hidden: the host gathers each real row's block of memory while padding rows share the
filler's, so on a host that swaps, or through CPU caches, reading fewer or rarely read
documents can be marginally faster or slower; keep the keys resident (enough memory, no
swap). The uncached path reads only token ids.

Memory: ``2 x L x N x W x K x D`` floats on the host (docs/guides/dp_rag.md), plus each
answer's batch cache (about 200 MB for 32 rows of SmolLM2-135M), copied to the device.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from synthgen.models import kv_cache, llama


@dataclasses.dataclass(frozen=True, eq=False)
class DocumentKV:
    """A head's and every document's keys and values (host arrays, config dtype).

    Privacy: derived from the private documents: kept in memory only, never saved, logged
    or shipped (no field is in its repr).

    Attributes:
      head: the head's token ids (H).
      head_k: the head's rotated keys [L, K, H, D]; head_v its values.
      k: every document's rotated keys after the head [L, N, K, W, D]; v their values.
      lengths: int [N], each document's number of tokens (<= W).
      digest: sha256 of the head, W and every document's (cut) token ids: which documents
        these are, to check a cache handed to another user of the same collection.
      params: the model parameters the keys were computed with (a reference, not a copy).
    """

    head: tuple[int, ...] = dataclasses.field(repr=False)
    head_k: np.ndarray = dataclasses.field(repr=False)
    head_v: np.ndarray = dataclasses.field(repr=False)
    k: np.ndarray = dataclasses.field(repr=False)
    v: np.ndarray = dataclasses.field(repr=False)
    lengths: np.ndarray = dataclasses.field(repr=False)
    digest: str = dataclasses.field(repr=False)
    params: object = dataclasses.field(repr=False)

    @property
    def width(self) -> int:
        """W, the public number of slots of every document."""
        return self.k.shape[3]

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
      extend: a jitted `kv_cache.extend` to reuse (compiled once per shape).
      batch: documents per call (a public shape).
      progress: a progress bar over the documents.
    """
    import jax

    if not head:
        raise ValueError("the head needs at least one token")
    if width < 1 or not documents:
        raise ValueError(f"need width >= 1 and at least one document: {width=}")
    extend = extend or jax.jit(kv_cache.extend)
    h, n = len(head), len(documents)
    cache = kv_cache.init_cache(config, 1, h)
    _, cache = jax.jit(kv_cache.prefill)(
        params, cache, np.array([head], np.int32), np.ones((1, h), np.int32)
    )
    head_k = np.stack([np.asarray(a[0]) for a in cache.k])
    head_v = np.stack([np.asarray(a[0]) for a in cache.v])
    shape = (config.num_layers, n, config.num_kv_heads, width, config.head_dim)
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
        head_only = _with_head(config, head_k, head_v, batch, h + width)
        filled = _device_cache(config, *head_only, np.full(batch, h), h)
        _, filled = extend(params, filled, ids, mask)
        rows = len(chunk)
        k[:, start : start + rows] = np.stack([np.asarray(a[:rows, :, h:]) for a in filled.k])
        v[:, start : start + rows] = np.stack([np.asarray(a[:rows, :, h:]) for a in filled.v])
    return DocumentKV(
        tuple(int(t) for t in head),
        head_k,
        head_v,
        k,
        v,
        lengths,
        documents_digest(head, documents, width),
        params,
    )


def documents_digest(head: Sequence[int], documents: Sequence[Sequence[int]], width: int) -> str:
    """sha256 over the head, the width and every document's first `width` token ids."""
    h = hashlib.sha256(f"W={width};head=".encode())
    h.update(np.asarray(head, np.int64).tobytes())
    for doc in documents:
        ids = np.asarray(list(doc)[:width], np.int64)
        h.update(len(ids).to_bytes(4, "little") + ids.tobytes())
    return h.hexdigest()


def _with_head(config, head_k, head_v, rows: int, slots: int):
    """Host keys, values and slot mask of `rows` rows and `slots` slots, the head first."""
    h = head_k.shape[2]
    shape = (config.num_layers, rows, config.num_kv_heads, slots, config.head_dim)
    k, v = np.zeros(shape, head_k.dtype), np.zeros(shape, head_v.dtype)
    k[:, :, :, :h], v[:, :, :, :h] = head_k[:, None], head_v[:, None]
    mask = np.zeros((rows, slots), bool)
    mask[:, :h] = True
    return k, v, mask


def _device_cache(config, k, v, mask, positions, index: int) -> kv_cache.KVCache:
    """The `kv_cache.KVCache` of host arrays (`_with_head`'s, filled further)."""
    import jax.numpy as jnp

    return kv_cache.KVCache(
        k=tuple(jnp.asarray(a) for a in k),
        v=tuple(jnp.asarray(a) for a in v),
        mask=jnp.asarray(mask),
        positions=jnp.asarray(positions, jnp.int32),
        index=jnp.asarray(index, jnp.int32),
        config=config,
    )


def session_cache(
    kv: DocumentKV, config: llama.LlamaConfig, rows: Sequence[int], batch: int, slots: int
) -> kv_cache.KVCache:
    """A decoding cache of `batch` rows whose row r holds the head and document rows[r]
    (rows past ``len(rows)`` repeat document rows[0]; their outputs are for no one), with
    `slots` slots in all; the next block goes into slot H + W.

    The same gather of `batch` rows of width W whichever documents are named."""
    h, w = len(kv.head), kv.width
    if not len(rows) or min(rows) < 0 or max(rows) >= kv.documents:
        raise ValueError(f"rows must name documents 0..{kv.documents - 1}")
    if slots < h + w + 1:
        raise ValueError(f"need more than H + W = {h + w} slots, got {slots}")
    index = np.zeros(batch, np.int64)
    index[: len(rows)] = rows
    index[len(rows) :] = rows[0]
    k, v, mask = _with_head(config, kv.head_k, kv.head_v, batch, slots)
    k[:, :, :, h : h + w], v[:, :, :, h : h + w] = kv.k[:, index], kv.v[:, index]
    lengths = kv.lengths[index]
    mask[:, h : h + w] = np.arange(w)[None] < lengths[:, None]
    return _device_cache(config, k, v, mask, h + lengths, h + w)
