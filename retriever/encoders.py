"""Text encoders for the dual-encoder retriever: BERT and T5 encoders, mean pooled, in Flax.

Two families load from local Hugging Face folders, with no torch at run time: ``bert``
(e.g. the ``all-minilm-l6-v2`` asset, WordPiece tokenizer; the model and its loading live in
`retriever.bert`, the tokenizers in `retriever.wordpiece`) and ``t5`` (the encoder stack of
`synthgen.models.t5.T5`). Both embed as sentence-transformers does: the mean of the last
hidden states over real tokens, L2 normalised (parity tested against
``scripts/make_minilm_fixture.py``'s golden file). `TextEncoder.apply` is pure and jittable;
`TextEncoder.encode` is the batched host API (bucketed lengths: few compiles);
`save_encoder` and `load_encoder` store and load fine-tuned params with their base model's
name. See docs/guides/retriever.md.

References:
  Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers"; Reimers and
  Gurevych 2019, "Sentence-BERT"; Wang et al. 2020, "MiniLM"; HF `modeling_bert.py`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, traverse_util
from tokenizers import Tokenizer as HFTokenizer
from tqdm.auto import tqdm

from retriever.bert import Bert, BertConfig, bert_params_from_hf, params_by_name, read_hf_tensors
from retriever.wordpiece import AppendEos, FixedLength, build_vocab, wordpiece_tokenizer
from synthgen.shards import Shard

PyTree = Any
FAMILIES = ("bert", "t5")
ENCODER_FILE = "encoder.json"
PARAMS_FILE = "params.msgpack"
DOC_TOWER_DIR = "doc_tower"  # an asymmetric encoder's document tower, inside its folder
RANDOM_PREFIX = "random:"  # load_encoder("random:bert") == random_encoder("bert")

# ---- the encoder ---------------------------------------------------------------------------


def params_sha256(params: PyTree) -> str:
    """SHA-256 of a parameter tree's paths, dtypes, shapes and values: which weights these are."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def mean_pool(states: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Mean of states [n, T, d] over real tokens (mask [n, T]); all-padding rows give 0."""
    mask = jnp.asarray(attention_mask, jnp.float32)[..., None]
    total = jnp.sum(states.astype(jnp.float32) * mask, axis=1)
    return total / jnp.maximum(jnp.sum(mask, axis=1), 1e-9)  # clamp as sentence-transformers


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x / max(||x||, eps) along the last axis (torch.nn.functional.normalize)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


class TextEncoder:
    """One tower of a dual encoder: tokenizer, Flax model and mean pooling with L2 norm.

    Attributes:
      name: the base model (asset name, folder, or "random:<family>") whose architecture
        and tokenizer this encoder uses; `save_encoder` records it.
      family: "bert" or "t5".
      dim: embedding width.
      params: Flax params of the tower.
      max_len: longest accepted input in tokens (BERT: position table or the
        sentence-transformers max_seq_length; T5: 512 unless set).
      config: the model's `BertConfig` or `T5Config`.
    """

    def __init__(
        self,
        *,
        name: str,
        family: str,
        config: Any,
        params: PyTree,
        tokenize_fn: Callable[[list[str], int], tuple[np.ndarray, np.ndarray]] | None,
        max_len: int,
        vocab: list[str] | None = None,
    ) -> None:
        """Wraps a model; use `load_encoder` or `random_encoder` rather than this.

        Args:
          name: see the class attributes.
          family: "bert" or "t5".
          config: `BertConfig` or `T5Config`.
          params: params of `Bert(config)`, or the shared+encoder params of `T5(config)`.
          tokenize_fn: (texts, max_len) -> (ids, mask), or None when the folder had no
            tokenizer (then `apply` needs token ids made elsewhere).
          max_len: longest accepted input.
          vocab: the vocabulary of a random encoder (stored by `save_encoder`).

        Raises:
          ValueError: unknown family or max_len < 2.
        """
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family=}")
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {max_len=}")
        self.name, self.family, self.config, self.params = name, family, config, params
        self.dim = config.hidden_size if family == "bert" else config.d_model
        self.max_len = max_len
        self.vocab = vocab
        # The folder `load_encoder` read (its provenance.json says what these weights were
        # trained on; training that starts here inherits it), or None.
        self.origin: Path | None = None
        self._tokenize_fn = tokenize_fn
        if family == "bert":
            self._states = Bert(config).apply
        else:
            from synthgen.models.t5 import T5

            self._states = functools.partial(T5(config).apply, method=T5.encode)
        self._jit_apply = jax.jit(self.apply)
        self._jit_apply_in_steps = jax.jit(self._apply_in_steps, static_argnums=2)

    def __repr__(self) -> str:
        return f"TextEncoder(name={self.name!r}, family={self.family!r}, dim={self.dim})"

    def tokenize(self, texts: Sequence[str], max_len: int) -> dict[str, np.ndarray]:
        """Token ids and mask, truncated and padded to `max_len`.

        Returns:
          {"input_ids": int32 [n, max_len], "attention_mask": int32 [n, max_len]}.

        Raises:
          ValueError: `texts` is a single string, max_len is out of range, or the encoder
            was loaded without a tokenizer.
        """
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings, got a single str")
        if not 2 <= max_len <= self.max_len:
            raise ValueError(f"max_len must be in [2, {self.max_len}], got {max_len=}")
        if self._tokenize_fn is None:
            raise ValueError(
                f"encoder {self.name!r} has no tokenizer (no spiece.model or tokenizer.json); "
                "pass token ids to apply()"
            )
        ids, mask = self._tokenize_fn(list(texts), max_len)
        return {"input_ids": ids, "attention_mask": mask}

    def apply(self, params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
        """L2-normalised mean-pooled embeddings float32 [n, dim] (pure, jittable).

        Args:
          params: params of this tower (e.g. `self.params` or fine-tuned ones).
          batch: "input_ids" and "attention_mask" [n, T]; other keys are ignored.
        """
        mask = batch["attention_mask"]
        states = self._states({"params": params}, batch["input_ids"], mask)
        return l2_normalize(mean_pool(states, mask))

    def encode(
        self,
        texts: Sequence[str],
        *,
        params: PyTree | None = None,
        batch_size: int = 64,
        max_len: int = 128,
        progress: bool = False,
    ) -> np.ndarray:
        """Embeds texts in length-sorted, length-bucketed batches: float32 [n, dim].

        Texts are tokenized once, sorted by token count and embedded `batch_size` at a time,
        each batch padded to the first of `_bucket_lengths(max_len)` that holds its longest
        text (the last one filled with all-padding rows): short texts cost little and the
        few bucket lengths bound the jit compiles. On CPU a batch runs in cache-sized steps
        (`_rows_per_step`). Padding is masked as a key and left out of the mean, so an
        embedding does not depend on its batch (up to float rounding). Output is in the
        order of `texts`.

        Args:
          texts: the texts.
          params: params to use (default: `self.params`).
          batch_size: texts per device call; fewer texts than that make one smaller batch.
          max_len: tokens per text (longer texts are truncated).
          progress: show a tqdm progress bar.

        Raises:
          ValueError: bad batch_size or max_len, or no tokenizer (see `tokenize`).
        """
        rows, embedded = self.encode_shard(
            texts, params=params, batch_size=batch_size, max_len=max_len, progress=progress
        )
        out = np.zeros((len(rows), self.dim), np.float32)
        out[rows] = embedded
        return out

    def encode_shard(
        self,
        texts: Sequence[str],
        shard: Shard | None = None,
        *,
        params: PyTree | None = None,
        batch_size: int = 64,
        max_len: int = 128,
        progress: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`encode`'s batches of one shard (`synthgen.shards`): (row indices, embeddings).

        The batches are `encode`'s (all texts tokenized and sorted by length), cut into
        `shard.count` contiguous runs; this shard embeds its run only. Its embeddings are
        bit for bit the unsharded `encode`'s rows, as each batch has the same texts and shape.
        Without `shard`, every row, in length order.
        """
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings, got a single str")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size=}")
        texts = list(texts)
        params = self.params if params is None else params
        if not texts:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        tokens = self._tokenize_ragged(texts, max_len)
        buckets = np.asarray(_bucket_lengths(max_len))
        order = np.argsort(tokens.lengths, kind="stable")
        size = min(batch_size, len(texts))
        first, end = (0, len(texts)) if shard is None else shard.document_range(len(texts), size)
        out = np.zeros((end - first, self.dim), np.float32)
        with tqdm(total=end - first, disable=not progress, desc="encode", unit="text") as bar:
            for start in range(first, end, size):
                rows = order[start : start + size]
                longest = int(tokens.lengths[rows].max())
                width = int(buckets[np.searchsorted(buckets, longest)])
                step = _rows_per_step(width, size)
                batch = tokens.batch(rows, width, -(-size // step) * step)
                embedded = self._jit_apply_in_steps(params, batch, step)
                out[start - first : start - first + len(rows)] = np.asarray(embedded)[: len(rows)]
                bar.update(len(rows))
        return order[first:end], out

    def _apply_in_steps(self, params: PyTree, batch: dict[str, jax.Array], rows: int) -> jax.Array:
        """`apply` on `rows` rows at a time, in sequence inside one call (rows divides n)."""
        n, width = batch["input_ids"].shape
        if rows >= n:
            return self.apply(params, batch)
        steps = {
            k: batch[k].reshape(n // rows, rows, width) for k in ("input_ids", "attention_mask")
        }
        return jax.lax.map(lambda b: self.apply(params, b), steps).reshape(n, self.dim)

    def _tokenize_ragged(self, texts: list[str], max_len: int) -> _RaggedTokens:
        """Tokenizes `texts` once, in chunks, keeping each text's tokens up to its last real one."""
        ids, masks, lengths = [], [], []
        for start in range(0, len(texts), _TOKENIZE_CHUNK):
            batch = self.tokenize(texts[start : start + _TOKENIZE_CHUNK], max_len)
            real = batch["attention_mask"] != 0
            width = real.shape[1]
            # One past the last real token (0 for none); with padding on the right (both
            # tokenizers) that is the token count, and cutting there drops padding only.
            length = np.where(real.any(axis=1), width - np.argmax(real[:, ::-1], axis=1), 0)
            keep = np.arange(width) < length[:, None]
            ids.append(batch["input_ids"][keep])
            masks.append(batch["attention_mask"][keep])
            lengths.append(length)
        return _RaggedTokens(ids, masks, np.concatenate(lengths))


_TOKENIZE_CHUNK = 4096  # texts per tokenizer call in `encode`: bounds the [n, max_len] arrays


def _bucket_lengths(max_len: int) -> tuple[int, ...]:
    """The padded lengths `TextEncoder.encode` uses for `max_len`, ascending, last = max_len.

    Multiples of a step of max_len / 8 rounded up to a multiple of 16 (so a text gets fewer
    than `step` padding tokens beyond its batch's longest text, and sizes suit vector units),
    plus the powers of two from 16 below the step for short texts such as queries: at most
    8 shapes for max_len <= 128, 9 for 256, 10 for 512, so few jit compiles.
    """
    step = -(-max_len // 128) * 16
    lengths = {min(k * step, max_len) for k in range(1, -(-max_len // step) + 1)}
    lengths.update(2**k for k in range(4, step.bit_length()) if 2**k < min(step, max_len))
    return tuple(sorted(lengths))


_CPU_TOKENS_PER_STEP = 1024


def _rows_per_step(width: int, batch_size: int) -> int:
    """Rows `encode` runs at once inside one device call of `batch_size` rows of `width`.

    On CPU, a batch runs as a sequence of steps of about `_CPU_TOKENS_PER_STEP` tokens (all
    rows at once for short texts): a step's activations, above all its [rows, heads, T, T]
    attention scores, then stay in cache. Measured with all-MiniLM-L6-v2 on 2 cores: 21.7 ->
    28.0 texts/s at [64, 256], 46.8 -> 63 at [64, 128]. Accelerators take the whole batch.
    Embeddings are unchanged up to float rounding (each row is computed on its own anyway).
    """
    if jax.default_backend() != "cpu":
        return batch_size
    return min(batch_size, max(1, _CPU_TOKENS_PER_STEP // width))


class _RaggedTokens:
    """Token ids and masks of many texts without padding, batched on demand."""

    def __init__(self, ids: list[np.ndarray], masks: list[np.ndarray], lengths: np.ndarray):
        # A trailing 0 gives out-of-text gathers (masked anyway) a valid index.
        self.ids = np.concatenate([*ids, np.zeros(1, np.int32)])
        self.masks = np.concatenate([*masks, np.zeros(1, np.int32)])
        self.lengths = lengths
        self.offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])

    def batch(self, rows: np.ndarray, width: int, size: int) -> dict[str, np.ndarray]:
        """Texts `rows` padded with 0 to [size, width] (rows beyond len(rows): all padding)."""
        cols = np.arange(width)
        inside = cols < self.lengths[rows][:, None]
        index = np.where(inside, self.offsets[rows][:, None] + cols, len(self.ids) - 1)
        pad = ((0, size - len(rows)), (0, 0))
        return {
            "input_ids": np.pad(self.ids[index].astype(np.int32), pad),
            "attention_mask": np.pad(self.masks[index].astype(np.int32), pad),
        }


# ---- loading, saving, random init ----------------------------------------------------------


def _st_max_len(path: Path) -> int | None:
    """The ``max_seq_length`` of the folder's sentence-transformers config, if it states one."""
    st_config = path / "sentence_bert_config.json"
    return json.loads(st_config.read_text()).get("max_seq_length") if st_config.exists() else None


def _bert_from_folder(name: str, path: Path, max_len: int | None) -> TextEncoder:
    config = BertConfig.from_hf_config(json.loads((path / "config.json").read_text()))
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    tokenizer = HFTokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    if max_len is None:
        max_len = _st_max_len(path) or config.max_position_embeddings
    if max_len > config.max_position_embeddings:
        raise ValueError(f"max_len must be <= {config.max_position_embeddings=}, got {max_len=}")
    params = bert_params_from_hf(config, read_hf_tensors(path))
    return TextEncoder(
        name=name,
        family="bert",
        config=config,
        params=params,
        tokenize_fn=FixedLength(tokenizer, "[PAD]"),
        max_len=max_len,
    )


def _t5_encoder_only(path: Path) -> tuple[Any, PyTree, Any]:
    """(config, shared+encoder params, tokenizer or None) of a HF `T5EncoderModel` folder.

    Tensors map by name (`synthgen.models.t5_loading.hf_name_map`, encoder stack only) with
    a shape check; a missing, unused or mis-shaped tensor is an error.
    """
    from synthgen.models.sentencepiece_tokenizer import load_tokenizer
    from synthgen.models.t5 import T5, T5Config
    from synthgen.models.t5_loading import hf_name_map

    config = T5Config.from_hf_config(json.loads((path / "config.json").read_text()))
    tensors = read_hf_tensors(path)
    shared = tensors.get("shared.weight")
    alias = tensors.pop("encoder.embed_tokens.weight", None)
    if shared is None and alias is not None:
        tensors["shared.weight"] = alias
    elif alias is not None and not np.array_equal(alias, shared):
        raise ValueError("encoder.embed_tokens.weight differs from shared.weight")
    ids = np.zeros((1, 2), np.int32)
    init = functools.partial(T5(config).init, method=T5.encode)
    shapes = jax.eval_shape(lambda: init(jax.random.key(0), ids, ids + 1))["params"]
    # The decoder and head of hf_name_map are not in `shapes`: not part of an encoder.
    params = params_by_name(hf_name_map(config), shapes, tensors, "T5 encoder", str(path))
    return config, params, load_tokenizer(path, required=False)


def _t5_from_folder(name: str, path: Path, max_len: int | None) -> TextEncoder:
    from synthgen.models.t5_loading import load_t5

    architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    if any(a.endswith("EncoderModel") for a in architectures):  # e.g. a `retriever export`
        config, params, tokenizer = _t5_encoder_only(path)
    else:
        config, params, tokenizer = load_t5(path, require_tokenizer=False)
    if max_len is None:
        max_len = _st_max_len(path)
    return TextEncoder(
        name=name,
        family="t5",
        config=config,
        params={k: params[k] for k in ("shared", "encoder")},
        tokenize_fn=None if tokenizer is None else AppendEos(tokenizer),
        max_len=512 if max_len is None else max_len,
    )


def _random_from_vocab(
    family: str, vocab: list[str], seed: int, max_len: int | None = None
) -> TextEncoder:
    tokenizer = wordpiece_tokenizer(vocab, t5=family == "t5")
    tokenize_fn = FixedLength(tokenizer, "[PAD]")
    key = jax.random.key(seed)
    ids = np.zeros((1, 4), np.int32)
    if family == "bert":
        config = BertConfig.tiny(vocab_size=len(vocab))
        params = jax.jit(Bert(config).init)(key, ids, ids + 1)["params"]
        max_len = config.max_position_embeddings if max_len is None else max_len
    elif family == "t5":
        from synthgen.models.t5 import T5, T5Config

        config = T5Config.preset("tiny", vocab_size=len(vocab))
        init = functools.partial(T5(config).init, method=T5.encode)  # no decoder params
        params = jax.jit(init)(key, ids, ids + 1)["params"]
        max_len = 128 if max_len is None else max_len
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family=}")
    return TextEncoder(
        name=f"{RANDOM_PREFIX}{family}",
        family=family,
        config=config,
        params=params,
        tokenize_fn=tokenize_fn,
        max_len=max_len,
        vocab=vocab,
    )


def random_encoder(
    family: str = "bert", *, seed: int = 0, vocab_texts: Iterable[str] | None = None
) -> TextEncoder:
    """A tiny random-init encoder for fast tests (BertConfig.tiny or the tiny T5 preset).

    Args:
      family: "bert" or "t5".
      seed: PRNG seed of the initialisation.
      vocab_texts: public texts for the WordPiece vocabulary (`build_vocab`; default: a
        fixed word list). Unknown words fall back to characters, never to [UNK] for ASCII.

    Raises:
      ValueError: unknown family.
    """
    return _random_from_vocab(family, build_vocab(vocab_texts), seed)


def _check_params(params: PyTree, reference: PyTree, where: Path) -> None:
    got = {k: np.shape(v) for k, v in traverse_util.flatten_dict(params).items()}
    want = {k: np.shape(v) for k, v in traverse_util.flatten_dict(reference).items()}
    for key in sorted(set(got) ^ set(want)):
        state = "missing" if key in want else "unexpected"
        raise ValueError(f"{where} does not fit its base: {state} parameter {'/'.join(key)!r}")
    for key, shape in want.items():
        if got[key] != shape:
            name = "/".join(key)
            raise ValueError(f"{where}: parameter {name=} has shape {got[key]}, expected {shape}")


def load_encoder(name_or_path: str | Path, *, max_len: int | None = None) -> TextEncoder:
    """Loads an encoder from an asset name, a HF BERT or T5 folder, or a `save_encoder` folder.

    The family is chosen by config.json's "model_type" ("bert"; "t5" or "mt5"); a T5 folder
    whose architecture is an encoder model (``T5EncoderModel``, as `retriever export` writes)
    holds the encoder stack only. A folder with encoder.json loads its base, then replaces
    the params with the stored ones. The names "random:bert" and "random:t5" give
    `random_encoder(family)`.

    Args:
      name_or_path: asset name (e.g. "all-minilm-l6-v2") or folder.
      max_len: longest accepted input in tokens (default: see `TextEncoder.max_len`).

    Returns:
      The encoder; its `name` is the base model's name, its `origin` the folder read.

    Raises:
      FileNotFoundError: no such folder or asset, or a folder without the needed files.
      ValueError: unsupported model type, or weights that do not fit the config.
      synthgen.assets.AssetError: a known asset that is not cached and cannot be fetched.
    """
    from synthgen import assets

    name = str(name_or_path)
    if name.startswith(RANDOM_PREFIX):
        return _random_from_vocab(name.removeprefix(RANDOM_PREFIX), build_vocab(), 0, max_len)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        if name not in assets.REGISTRY:
            raise FileNotFoundError(f"no encoder folder or known asset named {name!r}")
        path = assets.resolve(name)
    if not path.is_dir():
        raise FileNotFoundError(f"an encoder is a folder, got a file {str(path)!r}")
    if (path / ENCODER_FILE).exists():
        encoder = _load_saved(path, max_len)
    elif not (path / "config.json").exists():
        raise FileNotFoundError(f"no config.json or {ENCODER_FILE} in {path}")
    else:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
        if model_type == "bert":
            encoder = _bert_from_folder(name, path, max_len)
        elif model_type in ("t5", "mt5"):
            encoder = _t5_from_folder(name, path, max_len)
        else:
            raise ValueError(f"unsupported encoder model_type (bert, t5), got {model_type=}")
    encoder.origin = path.resolve()
    return encoder


def _load_saved(path: Path, max_len: int | None) -> TextEncoder:
    meta = json.loads((path / ENCODER_FILE).read_text())
    if not (path / PARAMS_FILE).exists():
        raise FileNotFoundError(f"no {PARAMS_FILE} in {path}")
    base = meta["base"]
    if max_len is None:
        max_len = meta.get("max_len")
    if base.startswith(RANDOM_PREFIX) and meta.get("vocab"):
        encoder = _random_from_vocab(base.removeprefix(RANDOM_PREFIX), meta["vocab"], 0, max_len)
    else:
        encoder = load_encoder(base, max_len=max_len)
    if encoder.family != meta.get("family", encoder.family):
        raise ValueError(f"{path} is a {meta['family']} encoder but its base is {encoder.family}")
    params = serialization.msgpack_restore((path / PARAMS_FILE).read_bytes())
    _check_params(params, encoder.params, path / PARAMS_FILE)
    encoder.params = jax.tree.map(jnp.asarray, params)
    return encoder


def save_encoder(
    encoder: TextEncoder, params: PyTree, out_dir: str | Path, *, extra: dict | None = None
) -> None:
    """Writes out_dir/encoder.json and out_dir/params.msgpack; `load_encoder(out_dir)` reads them.

    encoder.json holds ``{"base": encoder.name, "family", "dim", "max_len", **extra}`` (and the
    vocabulary of a random encoder); the base model itself is not copied.

    Args:
      encoder: the encoder whose architecture and tokenizer the params belong to.
      params: the tower's params (e.g. after fine-tuning).
      out_dir: output folder (created).
      extra: more JSON-serialisable metadata (e.g. training config, privacy spent).

    Raises:
      ValueError: params do not fit the encoder, or `extra` overrides a reserved key.
    """
    out_dir = Path(out_dir)
    _check_params(params, encoder.params, out_dir / PARAMS_FILE)
    meta: dict[str, Any] = {
        "base": encoder.name,
        "family": encoder.family,
        "dim": encoder.dim,
        "max_len": encoder.max_len,
    }
    if encoder.vocab is not None:
        meta["vocab"] = encoder.vocab
    clash = set(meta) & set(extra or {})
    if clash:
        raise ValueError(f"extra must not override reserved keys, got {sorted(clash)=}")
    meta.update(extra or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(np.asarray, params)
    (out_dir / PARAMS_FILE).write_bytes(serialization.msgpack_serialize(host))
    (out_dir / ENCODER_FILE).write_text(json.dumps(meta, indent=1) + "\n")
