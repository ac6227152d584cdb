"""Trained encoders and index embeddings in formats other tools read, with their provenance.

`export_encoder` writes a trained encoder folder as a sentence-transformers folder in the
base model's own Hugging Face layout (``model.safetensors`` converted by name with a shape
check, never by position; ``config.json``; the tokenizer files; the pooling and
``Normalize`` modules; ``provenance.json`` and a model card, `retriever.model_card`), which
``SentenceTransformer(DIR)``, ``transformers`` and `retriever.encoders.load_encoder` load
unchanged; a separate document tower goes to ``DIR/doc_tower``. `export_index` writes an
index folder's (doc_id, embedding) rows to Parquet for any vector database, with the
encoder and its provenance in the file's schema metadata. See docs/guides/retriever.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from retriever import provenance as prov
from retriever.encoders import DOC_TOWER_DIR, ENCODER_FILE, RANDOM_PREFIX, TextEncoder
from retriever.model_card import CARD_FILE, base_licence, model_card, read_evaluation

ENCODER_FORMATS = ("sentence-transformers",)
INDEX_FORMATS = ("parquet",)
WEIGHTS_FILE = "model.safetensors"
PARQUET_METADATA_KEY = b"dpsynth"
# Index rows are not covered by the encoder's statement, which is about its training data.
CORPUS_STATEMENT = (
    "the embeddings are a deterministic function of the indexed documents and carry no "
    "privacy guarantee for them: export an index of public documents only (the encoder's "
    "statement covers what it was trained on, not the corpus)"
)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "spiece.model",
    "added_tokens.json",
)
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
    },
]
# The T5 names of the specials of a random encoder's WordPiece vocabulary (same ids).
_T5_SPECIALS = {"[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>"}


# ---- weights -------------------------------------------------------------------------------


def _flat(params: Any) -> dict[tuple[str, ...], np.ndarray]:
    from flax import traverse_util

    return {k: np.asarray(v, np.float32) for k, v in traverse_util.flatten_dict(params).items()}


def _by_name(
    flat: dict[tuple[str, ...], np.ndarray],
    names: dict[tuple[str, ...], tuple[str, bool]],
    expected: dict[tuple[str, ...], tuple[int, ...]],
) -> dict[str, np.ndarray]:
    """HF-named tensors of `flat` through `names` (path -> (HF name, transpose)).

    Every parameter must have a name and the shape the architecture expects.
    """
    unnamed = sorted(set(flat) - set(names))
    if unnamed:
        raise ValueError(f"no Hugging Face name for parameter {'/'.join(unnamed[0])!r}")
    tensors = {}
    for path, (name, transpose) in names.items():
        key = "/".join(path)
        if path not in flat:
            raise ValueError(f"the encoder lacks parameter {key!r} (for {name})")
        if flat[path].shape != tuple(expected[path]):
            shape = flat[path].shape
            raise ValueError(f"parameter {key!r} has shape {shape}, not {expected[path]}")
        value = flat[path].T if transpose else flat[path]
        tensors[name] = np.ascontiguousarray(value)
    return tensors


def bert_hf_tensors(encoder: TextEncoder, base: dict[str, np.ndarray] | None = None) -> dict:
    """The BERT tower's params as HF `BertModel` tensors (float32, no ``bert.`` prefix).

    Args:
      encoder: a "bert" encoder (its `params` are exported).
      base: the base checkpoint's tensors: its ``pooler.*`` are kept, and every exported
        tensor it also holds must have its shape.

    Raises:
      ValueError: a parameter without a HF name, or a missing or mis-shaped one.
    """
    import jax

    from retriever.bert import Bert, bert_name_map

    ids = np.zeros((1, 2), np.int32)
    shapes = jax.eval_shape(lambda: Bert(encoder.config).init(jax.random.key(0), ids, ids + 1))
    expected = {k: v.shape for k, v in _flat_shapes(shapes["params"]).items()}
    tensors = _by_name(_flat(encoder.params), bert_name_map(encoder.config), expected)
    base = {k.removeprefix("bert."): v for k, v in (base or {}).items()}
    for name, value in tensors.items():
        if name in base and np.shape(base[name]) != value.shape:
            raise ValueError(f"{name} has shape {value.shape}, the base's {np.shape(base[name])}")
    for name, value in base.items():
        if name.startswith("pooler."):
            tensors[name] = np.ascontiguousarray(np.asarray(value, np.float32))
    return tensors


def t5_hf_tensors(encoder: TextEncoder) -> dict:
    """The T5 tower's params (shared + encoder) as HF `T5EncoderModel` tensors (float32).

    Raises:
      ValueError: a parameter without a HF name (e.g. a LoRA adapter), or a missing or
        mis-shaped one.
    """
    import functools

    import jax

    from synthgen.models.t5 import T5
    from synthgen.models.t5_loading import hf_name_map

    ids = np.zeros((1, 2), np.int32)
    init = functools.partial(T5(encoder.config).init, method=T5.encode)
    shapes = jax.eval_shape(lambda: init(jax.random.key(0), ids, ids + 1))["params"]
    expected = {k: v.shape for k, v in _flat_shapes(shapes).items()}
    names = {k: v for k, v in hf_name_map(encoder.config).items() if k in expected}
    return _by_name(_flat(encoder.params), names, expected)


def _flat_shapes(tree: Any) -> dict:
    from flax import traverse_util

    return traverse_util.flatten_dict(tree)


# ---- folders -------------------------------------------------------------------------------


def base_folder(name: str) -> Path | None:
    """The Hugging Face folder of a base model (asset or folder); None for ``"random:*"``.

    Raises:
      FileNotFoundError: neither a folder nor a known asset.
    """
    from synthgen import assets

    if name.startswith(RANDOM_PREFIX):
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name in assets.REGISTRY:
        return assets.resolve(name)
    raise FileNotFoundError(f"the base model {name!r} is neither a folder nor a known asset")


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", "utf-8")


def _rename(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {names.get(k, k): _rename(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return names.get(value, value) if isinstance(value, str) else value


def _random_tokenizer(encoder: TextEncoder, out: Path) -> None:
    """tokenizer.json (+ vocab.txt for BERT) of a random encoder's WordPiece vocabulary."""
    from retriever.wordpiece import wordpiece_tokenizer

    vocab = encoder.vocab or []
    if encoder.family == "bert":
        wordpiece_tokenizer(vocab).save(str(out / "tokenizer.json"))
        (out / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), "utf-8")
        specials = {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        }
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": True,
            "tokenize_chinese_chars": True,
            "strip_accents": None,
            **specials,
        }
    else:  # T5 names for the specials, so T5 tooling finds its pad and eos tokens
        tokenizer = json.loads(wordpiece_tokenizer(vocab, t5=True).to_str())
        _write_json(out / "tokenizer.json", _rename(tokenizer, _T5_SPECIALS))
        specials = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    _write_json(out / "tokenizer_config.json", {**config, "model_max_length": encoder.max_len})
    _write_json(out / "special_tokens_map.json", specials)


def _copy_tokenizer(base: Path, out: Path) -> None:
    if not any((base / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        raise ValueError(
            f"the base {base} has no tokenizer (tokenizer.json or spiece.model): other tools "
            "could not tokenize for the export"
        )
    for name in _TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)


def _hf_config(encoder: TextEncoder, base: Path | None) -> dict:
    """config.json of the export, checked against the trained encoder's config."""
    if encoder.family == "bert":
        from retriever.bert import BertConfig

        if base is not None:  # the exported weights are a `BertModel`'s, whatever the base's
            config = {
                **json.loads((base / "config.json").read_text()),
                "architectures": ["BertModel"],
            }
        else:
            c = encoder.config
            config = {
                "architectures": ["BertModel"],
                "model_type": "bert",
                "vocab_size": c.vocab_size,
                "hidden_size": c.hidden_size,
                "num_hidden_layers": c.num_hidden_layers,
                "num_attention_heads": c.num_attention_heads,
                "intermediate_size": c.intermediate_size,
                "max_position_embeddings": c.max_position_embeddings,
                "type_vocab_size": c.type_vocab_size,
                "layer_norm_eps": c.layer_norm_eps,
                "hidden_act": c.hidden_act,
                "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1,
                "initializer_range": 0.02,
                "pad_token_id": 0,
                "position_embedding_type": "absolute",
            }
        if BertConfig.from_hf_config(config) != encoder.config:
            raise ValueError(f"the base's config.json does not describe the encoder {encoder.name}")
        return config
    from synthgen.models.t5 import T5Config

    config = {**encoder.config.to_hf_config(), "architectures": ["T5EncoderModel"]}
    if T5Config.from_hf_config(config).to_hf_config() != encoder.config.to_hf_config():
        raise ValueError(f"the T5 config of {encoder.name} does not round-trip through HF's")
    return config


def _export_tower(encoder: TextEncoder, out: Path) -> None:
    """One tower as a sentence-transformers / Hugging Face folder in `out` (created)."""
    from safetensors.numpy import save_file

    from retriever.bert import read_hf_tensors

    base = base_folder(encoder.name)
    out.mkdir(parents=True, exist_ok=True)
    if encoder.family == "bert":
        base_tensors = None if base is None else read_hf_tensors(base)
        tensors = bert_hf_tensors(encoder, base_tensors)
    else:
        tensors = t5_hf_tensors(encoder)
    config = _hf_config(encoder, base)
    if base is None:
        _random_tokenizer(encoder, out)
    else:
        _copy_tokenizer(base, out)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    _write_json(out / "modules.json", _MODULES)
    st_config = {"max_seq_length": encoder.max_len, "do_lower_case": False}
    _write_json(out / "sentence_bert_config.json", st_config)
    _write_json(
        out / "config_sentence_transformers.json",
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )
    _write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": encoder.dim,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "include_prompt": True,
        },
    )


def _check_out(out: Path, source: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"the export folder {out} exists and is not empty: choose a new one")
    resolved, src = out.resolve(), source.resolve()
    if resolved == src or src in resolved.parents:
        raise ValueError(f"the export folder {out} must not be inside the encoder folder")


def export_encoder(
    encoder_dir: str | Path,
    out_dir: str | Path,
    *,
    format: str = "sentence-transformers",  # noqa: A002 - the command line's --format
    evaluation: str | Path | dict | None = None,
) -> dict:
    """Writes a trained encoder folder as a sentence-transformers folder (see the module).

    Args:
      encoder_dir: a folder `retriever train` or `train-dp` wrote (encoder.json,
        params.msgpack, provenance.json; doc_tower/ if separate).
      out_dir: the export folder (new or empty).
      format: "sentence-transformers" (the only one).
      evaluation: a `retriever evaluate` report of this encoder folder (its file or dict):
        its figures go into the model card.

    Returns:
      A summary: out, towers, base, licence, statement.

    Raises:
      ValueError: unknown format, a non-empty or nested out folder, weights or config that
        do not convert, a report of another encoder.
      FileNotFoundError: no trained encoder in `encoder_dir`, or its base is missing.

    Privacy:
      Exporting is post-processing of the trained encoder: its statement (provenance.json)
      carries over unchanged. Evaluation figures are copied only when given; the card says
      that they are not covered by the privacy statement.
    """
    from retriever.encoders import load_encoder

    if format not in ENCODER_FORMATS:
        raise ValueError(f"format must be one of {ENCODER_FORMATS}, got {format=}")
    source, out = Path(encoder_dir).expanduser(), Path(out_dir).expanduser()
    if not (source / ENCODER_FILE).is_file():
        raise FileNotFoundError(f"no trained encoder in {source} (missing {ENCODER_FILE})")
    _check_out(out, source)
    report = None if evaluation is None else read_evaluation(evaluation, source)
    record = prov.encoder_provenance(source)
    towers = [source]
    if (source / DOC_TOWER_DIR / ENCODER_FILE).is_file():
        towers.append(source / DOC_TOWER_DIR)
    # Written beside, then renamed: a failed export leaves no half-written folder.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        base = None
        for tower_dir in towers:
            target = partial / tower_dir.relative_to(source)
            encoder = load_encoder(tower_dir)
            base = base or encoder.name
            _export_tower(encoder, target)
            prov.write_provenance(target, prov.encoder_provenance(tower_dir))
        licence = base_licence(base, base_folder(base))
        meta = json.loads((source / ENCODER_FILE).read_text())
        card = model_card(
            record,
            base=base,
            licence=licence,
            evaluation=report,
            doc_tower=len(towers) > 1,
            max_seq_length=meta.get("max_len"),
            training=(meta.get("training") or {}).get("config"),
        )
        (partial / CARD_FILE).write_text(card, "utf-8")
        # Ordinary modes for a folder to ship (as the umask gives a new file and folder):
        # mkdtemp's 0700 and safetensors' 0600 are for the work in progress only.
        file_mode = (partial / CARD_FILE).stat().st_mode & 0o777
        folder_mode = (partial / "1_Pooling").stat().st_mode & 0o777
        os.chmod(partial, folder_mode)
        for weights in partial.rglob(WEIGHTS_FILE):
            os.chmod(weights, file_mode)
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {
        "out": str(out),
        "format": format,
        "towers": [str(out / t.relative_to(source)) for t in towers],
        "base": base,
        "licence": licence,
        "statement": record["statement"],
    }


# ---- index ---------------------------------------------------------------------------------


def export_index(
    index_dir: str | Path,
    out: str | Path,
    *,
    format: str = "parquet",  # noqa: A002
    encoder: str | Path | None = None,
) -> dict:
    """Writes an index folder's (doc_id, embedding) rows to a Parquet file.

    Columns: ``doc_id`` (string) and ``embedding`` (fixed-size list of float32, unit
    vectors). The schema metadata key ``dpsynth`` holds JSON: the encoder, its provenance,
    ``corpus_statement`` (the rows themselves carry no guarantee for the indexed documents),
    the dimension, the row count and the similarity (dot product of unit vectors, i.e.
    cosine).

    The provenance is never dropped: it is the copy ``index.json`` recorded at build time
    (`retriever.index_folder.index_encoder`), so the encoder folder need not be there. A
    format 1 index has no copy: its encoder is found as `retriever index query` finds it,
    with a warning, or the export is refused rather than state no provenance in place of
    what may be a DP guarantee.

    Args:
      index_dir: a folder `retriever index build` wrote.
      out: the Parquet file (its folder is created; an existing file is refused).
      format: "parquet" (the only one).
      encoder: the index's encoder where it moved (format 1); for format 2 it must have
        the recorded provenance.

    Returns:
      A summary: out, rows, dim, statement (the encoder's), corpus_statement.

    Raises:
      ValueError: unknown format, an existing file, a searcher that keeps no float
        embeddings, or an `encoder` whose provenance is not the recorded one.
      FileNotFoundError: no index in `index_dir`; a format 1 index whose encoder is not
        found.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from retriever.index_folder import index_embeddings, index_encoder, read_index_meta

    if format not in INDEX_FORMATS:
        raise ValueError(f"format must be one of {INDEX_FORMATS}, got {format=}")
    out = Path(out).expanduser()
    if out.exists():
        raise ValueError(f"{out} exists: choose a new file")
    meta = read_index_meta(index_dir)
    reference, record = index_encoder(index_dir, encoder=encoder, meta=meta, load=False)
    embeddings = index_embeddings(index_dir)
    doc_ids = [str(d) for d in meta["doc_ids"]]
    if len(doc_ids) != len(embeddings):
        raise ValueError(f"{index_dir}: {len(doc_ids)} doc_ids for {len(embeddings)} embeddings")
    dim = int(embeddings.shape[1])
    values = pa.array(np.ascontiguousarray(embeddings, np.float32).reshape(-1), pa.float32())
    table = pa.table(
        {
            "doc_id": pa.array(doc_ids, pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(values, dim),
        }
    )
    info = {
        "encoder": reference,
        "provenance": record,
        "corpus_statement": CORPUS_STATEMENT,
        "dim": dim,
        "rows": len(doc_ids),
        "similarity": "dot product of unit vectors (= cosine)",
        "index_kind": meta.get("kind"),
    }
    table = table.replace_schema_metadata(
        {PARQUET_METADATA_KEY: json.dumps(info, ensure_ascii=False).encode()}
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return {
        "out": str(out),
        "rows": len(doc_ids),
        "dim": dim,
        "statement": record["statement"],
        "corpus_statement": CORPUS_STATEMENT,
    }
