"""DP query generator (Carranza et al. 2023): DP fine-tuning on (document -> query) pairs, then
synthetic queries for documents. See docs/guides/querygen.md.

Privacy:
  Unit: one (document, query) pair; queries are private, documents public (query-level
  DP). Fine-tuning is DP-Adafactor (`synthgen.dp_train`; delta = 1/(2n) by default),
  charged to the ledger before training. Generating queries reads only public documents
  and the DP model: post-processing, no further budget. A random-init model's vocabulary
  is trained on a fixed public corpus, not on the pairs' documents: which documents the
  pairs name, and how often, is private. The released generator folder holds the
  weights, configs, tokenizer and privacy metadata: no resume state (it stays in the
  private work folder, `synthgen.work_folder`), no losses or timings of the training.

References: Carranza, Farahani, Ponomareva, Kurakin, Jagielski, Nasr 2023, "Synthetic Query
Generation for Privacy-Preserving Deep Retrieval Systems using Differentially Private
Language Models".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import datasets
import jax
import numpy as np
from flax import serialization

from synthgen import dp_train, run_seed, shards
from synthgen.corpora import file_sha256
from synthgen.generator_models import LlamaFamily, T5Family, merge_params, split_trainable
from synthgen.models.sampling_config import SamplingConfig
from synthgen.paths import cache_dir, default_work_dir
from synthgen.querygen_config import VOCABULARY_CORPUS, VOCABULARY_DOCUMENTS, GeneratorConfig
from synthgen.shards import Shard
from synthgen.work_folder import OncePayer, WorkFolder, check_apart

GENERATOR_FILE = "generator.json"
PARAMS_FILE = "params.msgpack"
SEEDED_NOTE = (
    "the DP-SGD noise and the Poisson sampler came from a fixed seed: reproducible by anyone "
    "who knows the seed, so this generator is for tests only, not for publication"
)


# ---- loading models ----------------------------------------------------------------------


def _config_from_dict(cls, data: dict):
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
    )


VOCABULARY_CACHE = "vocabularies"
"""The asset cache's folder of random-init bases' vocabularies (`train_sentencepiece`)."""


def public_vocabulary_texts() -> list[str]:
    """The public texts every random-init base's vocabulary is trained on.

    Privacy: the vocabulary ships in the release folder and is not a DP release, so it is a
    function of this fixed public corpus only; a vocabulary trained on the run's documents
    would publish which documents the private pairs name, and how often.
    """
    from synthgen.corpora import load_wiki_summaries

    return list(load_wiki_summaries(VOCABULARY_CORPUS, limit=VOCABULARY_DOCUMENTS)["document"])


def load_base(
    config: GeneratorConfig,
    *,
    tokenizer_dir: Path | None = None,
    seed: int = 0,
    vocabulary_cache: Path | None = None,
):
    """Returns (family adapter, params) for the configured base model.

    For "random:<preset>", trains a SentencePiece vocabulary on `public_vocabulary_texts()`
    into `tokenizer_dir` (reusing one trained before in `vocabulary_cache`, default the asset
    cache's `VOCABULARY_CACHE`, which outlives the run), then initialises the model from
    `seed`.
    """
    lora = dict(lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)
    compute = dict(dtype=config.dtype, remat=config.remat)
    if config.base.startswith("random:"):
        preset = config.base.split(":", 1)[1]
        if tokenizer_dir is None:
            raise ValueError("a random-init base needs a folder for its vocabulary")
        from synthgen.models.sentencepiece_tokenizer import train_sentencepiece

        cache = vocabulary_cache or cache_dir() / VOCABULARY_CACHE
        tokenizer = train_sentencepiece(
            public_vocabulary_texts(), config.vocab_size, tokenizer_dir, cache=cache
        )
        return _random_init(config.family, preset, tokenizer, {**lora, **compute}, seed)
    # Parameters load in float32 (what DP-Adafactor updates); only the matmuls run in
    # `config.dtype`.
    if config.family == "t5":
        from synthgen.models.t5_loading import load_t5

        model_config, params, tokenizer = load_t5(config.base, **lora)
        return T5Family(dataclasses.replace(model_config, **compute), tokenizer), params
    from synthgen.models.llama_loading import load_llama

    model_config, params, tokenizer = load_llama(config.base, **lora)
    return LlamaFamily(dataclasses.replace(model_config, **compute), tokenizer), params


def _random_init(family: str, preset: str, tokenizer, overrides: dict, seed: int):
    family_cls, model_cls, config_cls = _family_classes(family)
    if family == "llama" and preset != "tiny":
        raise ValueError(f"random llama presets: tiny; got {preset=}")
    base = config_cls.preset(preset) if family == "t5" else config_cls.tiny()
    cfg = dataclasses.replace(base, vocab_size=tokenizer.vocab_size, **overrides)
    ids = np.zeros((1, 4), np.int32)
    inputs = (ids, np.ones_like(ids), ids) if family == "t5" else (ids,)
    params = model_cls(cfg).init(jax.random.key(seed), *inputs)["params"]
    return family_cls(cfg, tokenizer), params


def _family_classes(family: str):
    """(family adapter, model, model config) classes of a family."""
    if family == "t5":
        from synthgen.models.t5 import T5, T5Config

        return T5Family, T5, T5Config
    from synthgen.models.llama import Llama, LlamaConfig

    return LlamaFamily, Llama, LlamaConfig


# ---- training ----------------------------------------------------------------------------


def _check_pairs(pairs: datasets.Dataset, document_field: str, query_field: str) -> None:
    if len(pairs) == 0:
        raise ValueError("the training set is empty")
    missing = [f for f in (document_field, query_field) if f not in pairs.column_names]
    if missing:
        raise ValueError(f"training data lacks field(s) {missing}; has {pairs.column_names}")
    empty = sum(1 for q in pairs[query_field] if not str(q).strip())
    if empty:
        raise ValueError(f"{empty} training rows have an empty {query_field!r}")


def train_generator(
    config: GeneratorConfig,
    pairs: datasets.Dataset,
    out_dir: str | Path,
    *,
    document_field: str = "document",
    query_field: str = "query",
    pay: OncePayer | None = None,
    work_dir: str | Path | None = None,
    keep_work: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    plan: dp_train.PrivacyPlan | None = None,
    fixed_rate: bool = False,
) -> dp_train.TrainResult:
    """DP-fine-tunes the generator on private (document, query) pairs; writes `out_dir`.

    Bad input (empty data, missing fields, epsilon <= 0, delta >= 1/n) raises ValueError
    before any compute. The resume state goes to the private `work_dir`.

    Args:
      config: the run's configuration.
      pairs: private training pairs.
      out_dir: the release folder (what `generate_queries` reads and a user ships).
      document_field, query_field: column names in `pairs`.
      pay: the run's payer (`synthgen.work_folder.run_payer`: a ledger scope and this
        run's work folder), charged once before the first step; None: not charged.
      work_dir: private work folder (checkpoints, noise key, sampler state, charge
        record): the payer's, else `synthgen.paths.default_work_dir(out_dir)`. Calling
        again with the same folders resumes an interrupted run.
      keep_work: keep the (secret) work folder after a finished run; by default it is
        deleted once the release is written (an interrupted run keeps it).
      progress: show a progress bar.
      stop_after: stop after this many steps (to test resumption).
      plan: precomputed `dp_train.plan_privacy(config.dp, len(pairs))`.
      fixed_rate: `plan` may be made for more pairs than given; each pair is drawn at the
        plan's Poisson rate (see `dp_train.train`; canary audits use it).

    Privacy:
      See the module docstring: (epsilon, delta)-DP w.r.t. one (document, query) pair,
      stated in `out_dir/generator.json` and charged through `pay` before the first step.
      Nothing of the mechanism's randomness and no statistic of the private data (loss,
      timing) is written to `out_dir`.
    """
    _check_pairs(pairs, document_field, query_field)
    if plan is None:  # validates epsilon, delta and sizes before any compute
        plan = dp_train.plan_privacy(config.dp, len(pairs))
    out = Path(out_dir)
    if pay is None:
        work = WorkFolder(work_dir if work_dir is not None else default_work_dir(out))
    else:
        if not isinstance(pay, OncePayer):
            raise ValueError(
                "a training run is paid by its run payer (synthgen.work_folder.run_payer)"
            )
        if work_dir is not None and Path(work_dir).resolve() != pay.work.path.resolve():
            raise ValueError(f"work_dir={work_dir} is not the payer's work folder {pay.work.path}")
        if not plan.private:
            raise ValueError("a non-private run (noise_multiplier=0) cannot be charged to a ledger")
        # Refuse an over-budget run before loading anything; a resumed run whose charge is
        # in the ledger passes. `dp_train.train` pays (atomically, once) before step 1.
        pay.check(plan)
        work = pay.work
    check_apart(out, work.path)
    out.mkdir(parents=True, exist_ok=True)
    documents, queries = pairs[document_field], pairs[query_field]
    # The initialisation of a random-init base is public (seed 0, a public vocabulary):
    # never derived from the mechanism's secret seed or the private pairs, which the released
    # model must not carry a trace of.
    family, params = load_base(
        config,
        tokenizer_dir=out / "tokenizer",
        seed=0,
    )
    data = family.encode_pairs(documents, queries, config.input_len, config.target_len)
    lora = config.lora_rank > 0
    trainable, frozen = split_trainable(params, lora=lora)
    result = dp_train.train(
        family.loss_fn(),
        trainable,
        frozen,
        data,
        config.dp,
        lora=lora,
        work_dir=work.path,
        pay=pay,
        description=f"query generator {config.family} base={config.base} n={len(pairs)}",
        progress=progress,
        stop_after=stop_after,
        plan=plan,
        fixed_rate=fixed_rate,
        tapped_loss_fn=family.tapped_loss_fn(),
    )
    if result.steps_run < plan.steps:
        return result  # interrupted on purpose; the work folder stays: call again to resume
    # LoRA on a pretrained base stores only the adapters (the base is re-loaded from its
    # asset); otherwise the full parameters are stored.
    to_save = result.trainable
    if lora and config.base.startswith("random:"):
        to_save = merge_params(result.trainable, jax.device_get(frozen))
    (out / PARAMS_FILE).write_bytes(
        serialization.msgpack_serialize(jax.tree.map(np.asarray, to_save))
    )
    record = {
        "family": config.family,
        "base": config.base,
        "lora_rank": config.lora_rank,
        "model_config": dataclasses.asdict(family.config),
        "generator_config": _released_config(config),
        "privacy": _privacy_block(result.plan, None if pay is None else pay.scope),
        "randomness": _randomness(config),
    }
    (out / GENERATOR_FILE).write_text(json.dumps(record, indent=1))
    if not keep_work:
        work.discard()  # the release is complete: the secret resume state goes
    return result


def _released_config(config: GeneratorConfig) -> dict:
    """The run's config without its secret: a fixed (test) seed replays the noise."""
    return json.loads(json.dumps(dataclasses.asdict(config.replace(dp_seed=None)), default=str))


def _randomness(config: GeneratorConfig) -> dict:
    """Whether the mechanism's randomness came from a fixed (test) seed; never the seed."""
    seeded = config.dp.seed is not None
    return {"seeded": seeded, "note": SEEDED_NOTE if seeded else "OS entropy"}


def _privacy_block(plan: dp_train.PrivacyPlan, charged: tuple[str, str] | None) -> dict:
    """The released guarantee: plan, unit, mechanism and the ledger scope charged (None: not
    charged), so that whatever is trained on the release can state it (`retriever.provenance`)."""
    block = plan.to_dict()
    block.update(
        unit="one (document, query) pair; queries private, documents public",
        mechanism="DP-Adafactor: per-example L2 clipping + Gaussian noise (Abadi et al. 2016)"
        if plan.private
        else "NON-PRIVATE reference run: per-example clipping, no noise (epsilon = infinity)",
        ledger_scope=None
        if charged is None
        else {"tenant": str(charged[0]), "dataset": str(charged[1])},
    )
    return block


def first_line(text: str) -> str:
    """The first non-empty line of a generated query, stripped (queries are one line)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def load_generator(model_dir: str | Path):
    """Returns (family adapter, full params, generator record) of a trained generator."""
    model_dir = Path(model_dir)
    path = model_dir / GENERATOR_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no trained generator in {model_dir} (missing {GENERATOR_FILE})")
    record = json.loads(path.read_text())
    gen_cfg = record["generator_config"]  # its "dp" is popped (the record then lacks it)
    config = GeneratorConfig(dp=dp_train.DPConfig(**gen_cfg.pop("dp")), **gen_cfg)
    trainable_bytes = (model_dir / PARAMS_FILE).read_bytes()
    if config.base.startswith("random:"):
        family_cls, _, config_cls = _family_classes(config.family)
        from synthgen.models.sentencepiece_tokenizer import SentencePieceTokenizer

        tokenizer = SentencePieceTokenizer.load(model_dir / "tokenizer")
        family = family_cls(_config_from_dict(config_cls, record["model_config"]), tokenizer)
        params = serialization.msgpack_restore(trainable_bytes)
        return family, params, record
    family, base_params = load_base(config)
    trainable = serialization.msgpack_restore(trainable_bytes)
    if config.lora_rank > 0:
        _, frozen = split_trainable(base_params, lora=True)
        return family, merge_params(trainable, frozen), record
    return family, trainable, record


# ---- generation --------------------------------------------------------------------------


def generate_queries(
    model_dir: str | Path,
    documents: datasets.Dataset,
    out_dir: str | Path,
    *,
    queries_per_doc: int | None = None,
    top_p: float | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    doc_id_field: str = "doc_id",
    document_field: str = "document",
    progress: bool = True,
    shard: Shard | None = None,
) -> datasets.Dataset:
    """Writes synthetic (doc_id, document, query) rows (JSONL + Parquet) and metadata.json.

    With `shard` (I/N), only that shard's documents (`synthgen.shards`; joined by
    `merge_query_shards`); shards need a `seed` (one sampling stream for all of them).

    Privacy:
      Post-processing of the DP generator on public documents: no further budget. The
      metadata repeats the generator's guarantee (with its ledger scope), which an encoder
      trained on the queries inherits (`retriever.provenance.synthetic`).
    """
    # the weights a shard samples from, hashed before they are read (checked by the merge)
    weights_sha256 = None if shard is None else file_sha256(Path(model_dir) / PARAMS_FILE)
    family, params, record = load_generator(model_dir)
    cfg = record["generator_config"]
    missing = [f for f in (doc_id_field, document_field) if f not in documents.column_names]
    if missing:
        raise ValueError(f"documents lack field(s) {missing}; has {documents.column_names}")
    k = queries_per_doc or cfg["queries_per_doc"]
    sampling = SamplingConfig(
        temperature=cfg["temperature"] if temperature is None else temperature,
        top_p=cfg["top_p"] if top_p is None else top_p,
    )
    max_new = max_new_tokens or cfg["max_new_tokens"]
    total, first = len(documents), 0
    if shard is not None:
        if seed is None:
            raise ValueError("a shard needs a seed: every shard must draw from one sampling stream")
        job_documents = hashlib.sha256(
            json.dumps([list(documents[doc_id_field]), list(documents[document_field])]).encode()
        ).hexdigest()
        first, end = shard.document_range(total, cfg["generation_batch"])
        documents = documents.select(range(first, end))
    key = run_seed.sampling_key(seed)  # 128 bits of OS entropy unless a seed is given
    start = time.time()
    texts = family.generate(
        params,
        documents[document_field],
        input_len=cfg["input_len"],
        max_new_tokens=max_new,
        sampling=sampling,
        key=key,
        num_samples=k,
        batch_size=cfg["generation_batch"],
        progress=progress,
        first_document=first,
    )
    rows = {"doc_id": [], "document": [], "query": []}
    for doc_id, document, queries in zip(
        documents[doc_id_field], documents[document_field], texts, strict=True
    ):
        for query in queries:
            rows["doc_id"].append(doc_id)
            rows["document"].append(document)
            rows["query"].append(first_line(query))
    metadata = {
        "privacy": record["privacy"],
        # the generator's: a seeded training run marks every query set drawn from it
        "randomness": record.get("randomness", {"seeded": None, "note": "not recorded"}),
        "post_processing": "queries are sampled from the DP generator given public documents;"
        " generation spends no privacy budget; each query is cut to its first non-empty line",
        "model": {
            **{k: record[k] for k in ("family", "base", "lora_rank")},
            "config": record["model_config"],
            "generator_dir": str(Path(model_dir).absolute()),
        },
        "generation": {
            "top_p": sampling.top_p,
            "temperature": sampling.temperature,
            "queries_per_doc": k,
            "max_new_tokens": max_new,
            "seconds": time.time() - start,
        },
        "generator_config": cfg,
    }
    if shard is not None:
        # What every shard of one job shares (checked by `merge_query_shards`). The seed's hash
        # only matches shards; it hides nothing (a typed seed is easy to guess), nor needs to.
        metadata["shard"] = {
            "index": shard.index,
            "count": shard.count,
            "documents": [first, first + len(documents)],
            "total_documents": total,
            "documents_sha256": job_documents,
            "generator_sha256": weights_sha256,
            "seed_sha256": hashlib.sha256(str(seed).encode()).hexdigest(),
            "platform": shards.platform(),
        }
    return write_query_folder(Path(out_dir), rows, metadata, len(documents))


def write_query_folder(
    out: Path, rows: dict, metadata: dict, num_documents: int
) -> datasets.Dataset:
    """Writes a query folder: `rows` (columns doc_id, document, query) as queries.jsonl and
    queries.parquet, and `metadata` with the counts and the files' SHA-256 added."""
    out.mkdir(parents=True, exist_ok=True)
    dataset = datasets.Dataset.from_dict(rows)
    dataset.to_json(out / "queries.jsonl", lines=True, force_ascii=False)
    dataset.to_parquet(out / "queries.parquet")
    metadata = {
        **metadata,
        "num_documents": num_documents,
        "num_queries": len(dataset),
        "files": {f: file_sha256(out / f) for f in ("queries.jsonl", "queries.parquet")},
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1))
    return dataset


_SHARED_BY_SHARDS = (
    "count",
    "total_documents",
    "documents_sha256",
    "generator_sha256",
    "seed_sha256",
    "platform",
)
"""The shard records' fields every shard of one job shares (`merge_query_shards`)."""


def merge_query_shards(shard_dirs: Sequence[str | Path], out_dir: str | Path) -> datasets.Dataset:
    """Joins the folders of `generate_queries(..., shard=I/N)` for I = 0..N-1 into one.

    The joined queries.jsonl and queries.parquet are byte-identical to the unsharded run's
    (same generator, documents, settings and seed, on the same platform); metadata.json
    matches it but for the summed generation time and `merged_shards`.

    Raises:
      ValueError: a folder that is not a shard, shards of different jobs, a missing or
        repeated shard.
    """
    metas = []
    for folder in map(Path, shard_dirs):
        meta = json.loads((folder / "metadata.json").read_text())
        if "shard" not in meta:
            raise ValueError(f"{folder} is not a shard of generate-queries (no shard record)")
        metas.append((meta["shard"]["index"], folder, meta))
    if not metas:
        raise ValueError("no shard folders given")
    metas.sort(key=lambda m: m[0])
    count = metas[0][2]["shard"]["count"]
    if [m[0] for m in metas] != list(range(count)):
        raise ValueError(f"need shards 0..{count - 1} once each, got {[m[0] for m in metas]}")
    first = metas[0][2]

    def job(meta: dict) -> tuple:
        generation = {k: v for k, v in meta["generation"].items() if k != "seconds"}
        shared = [meta["privacy"], meta["model"], meta["generator_config"], generation]
        return (json.dumps(shared), *(json.dumps(meta["shard"][k]) for k in _SHARED_BY_SHARDS))

    position = 0
    for _, folder, meta in metas:
        if job(meta) != job(first):
            raise ValueError(
                f"{folder} is a shard of another job (documents, generator, settings, seed or "
                "platform)"
            )
        if file_sha256(folder / "queries.jsonl") != meta["files"]["queries.jsonl"]:
            raise ValueError(f"{folder}/queries.jsonl is not the file its shard wrote")
        lo, hi = meta["shard"]["documents"]
        if lo != position:
            raise ValueError(f"{folder} starts at document {lo}, expected {position}")
        position = hi
    if position != first["shard"]["total_documents"]:
        raise ValueError(f"the shards cover {position} of {first['shard']['total_documents']}")
    rows = {"doc_id": [], "document": [], "query": []}
    for _, folder, _ in metas:
        with open(folder / "queries.jsonl", encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                for name in rows:
                    rows[name].append(row[name])
    metadata = {
        k: v
        for k, v in first.items()
        if k not in ("shard", "num_documents", "num_queries", "files")
    }
    metadata["generation"] = {
        **first["generation"],
        "seconds": sum(m[2]["generation"]["seconds"] for m in metas),
    }
    metadata["merged_shards"] = count
    return write_query_folder(Path(out_dir), rows, metadata, position)
