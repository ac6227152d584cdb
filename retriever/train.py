"""Dual-encoder training: in-batch softmax on (query, document) pairs, and a direct-DP baseline.

`train_retriever` (non-private: post-processing on DP synthetic pairs, or the epsilon =
infinity reference on real ones): in-batch softmax over scaled cosine similarities, other
pairs sharing the positive document masked out, AdamW, resumable orbax checkpoints in a work
folder outside the release, data parallel over local devices. `train_retriever_dp` is the
"direct DP" baseline of Carranza et al. (Table 4): DP-Adafactor via `synthgen.dp_train` on
the real pairs. Both write the towers with ``provenance.json`` (`save_trained`), never
resume state. See docs/guides/retriever.md.

Privacy of the DP baseline:
  Unit: one (query, document) pair; add/remove-one neighbours (Poisson sampling). An
  in-batch softmax couples examples (each pair's document is a negative in the others'
  losses), so clipping its per-example losses would not bound one pair's influence by C.
  Here the query tower is trained, the document tower is frozen at the public pretrained
  encoder and the negatives are *all* public corpus documents: pair i's loss depends on
  pair i alone, per-example clipping gives L2 sensitivity exactly C, and the run is the
  subsampled Gaussian mechanism `synthgen.dp_train` accounts for and charges. The resume
  state (noise key, sampler, optimizer) stays in the private work folder; no loss or
  timing of the private training is written.
  References: Abadi et al. 2016; Carranza et al. 2023.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from retriever import provenance as prov
from retriever.encoders import DOC_TOWER_DIR, TextEncoder, params_sha256, save_encoder
from retriever.train_config import RetrieverConfig
from synthgen import dp_train
from synthgen.checkpoints import TrainCheckpoints
from synthgen.paths import default_work_dir
from synthgen.privacy.receipts import Payer
from synthgen.work_folder import CHECKPOINTS, OncePayer, WorkFolder, check_apart, private_folder

PyTree = Any


@dataclasses.dataclass
class RetrieverResult:
    """Output of a training run: parameters by tower, the per-step losses, timing, and how
    many pairs per epoch filled no batch (left out of that epoch)."""

    params: dict[str, PyTree]
    losses: list[float]
    steps_run: int
    total_steps: int
    seconds: float
    pairs_per_second: float
    pairs_left_out_per_epoch: int = 0


def in_batch_softmax_loss(
    q: jax.Array,
    d: jax.Array,
    doc_keys: jax.Array,
    scale: jax.Array,
    negatives: jax.Array | None = None,
    negative_keys: jax.Array | None = None,
) -> jax.Array:
    """Mean cross-entropy of each query against its own document among the batch's documents
    (and the batch's hard negatives, if given).

    Args:
      q, d: L2-normalised query and document embeddings [B, dim]; row i is a pair.
      doc_keys: int [B] document identities; another document with the same identity as a
        query's own is not a negative for it (it is masked out).
      scale: logit scale (1 / temperature).
      negatives: [B, dim] embeddings of the pairs' hard negatives, shared by the batch.
      negative_keys: int [B] their document identities; -1 for a pair without one (that
        column is masked out for every query).
    """
    docs, keys = d, doc_keys
    if negatives is not None:
        docs = jnp.concatenate([d, negatives])
        keys = jnp.concatenate([doc_keys, negative_keys])
    logits = scale * (q @ docs.T)
    same = doc_keys[:, None] == keys[None, :]
    own = jnp.eye(len(q), len(keys), dtype=bool)
    logits = jnp.where((same & ~own) | (keys < 0)[None, :], -jnp.inf, logits)
    return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=-1)))


def _towers(params: dict) -> tuple[PyTree, PyTree]:
    return params["query"], params.get("doc", params["query"])


def _schedule(config: RetrieverConfig, total_steps: int) -> optax.Schedule:
    warmup = max(1, total_steps // 10)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, config.learning_rate, warmup),
            optax.linear_schedule(config.learning_rate, 0.0, max(1, total_steps - warmup)),
        ],
        [warmup],
    )


def _tokenize_pairs(encoder: TextEncoder, queries, documents, config: RetrieverConfig) -> dict:
    q = encoder.tokenize(list(queries), config.max_query_len)
    d = encoder.tokenize(list(documents), config.max_doc_len)
    return {
        "q_ids": q["input_ids"],
        "q_mask": q["attention_mask"],
        "d_ids": d["input_ids"],
        "d_mask": d["attention_mask"],
    }


def _negatives(documents, hard_negatives, hard_negative_ids, n):
    """(texts, keys) of the pairs' hard negatives, key None for a pair without one (its text
    is a stand-in, the pair's document, whose column the loss masks for every query);
    ([], []) without hard negatives."""
    if hard_negatives is None:
        return [], []
    ids = hard_negative_ids if hard_negative_ids is not None else hard_negatives
    if len(hard_negatives) != n or len(ids) != n:
        raise ValueError(f"need one hard negative (or None) per pair: {n} pairs")
    texts, out_keys = [], []
    for text, key, document in zip(hard_negatives, ids, documents, strict=True):
        missing = text is None or key is None
        texts.append(document if missing else text)
        out_keys.append(None if missing else str(key))
    return texts, out_keys


def _check_pairs(queries: Sequence[str], documents: Sequence[str], batch_size: int) -> None:
    if len(queries) != len(documents):
        raise ValueError(f"{len(queries)=} queries for {len(documents)=} documents")
    if len(queries) < batch_size:
        raise ValueError(f"{len(queries)} pairs are fewer than one batch ({batch_size=})")
    if any(not str(q).strip() for q in queries):
        raise ValueError("training pairs contain an empty query")


def train_retriever(
    encoder: TextEncoder,
    queries: Sequence[str],
    documents: Sequence[str],
    config: RetrieverConfig,
    *,
    doc_ids: Sequence[str] | None = None,
    hard_negatives: Sequence[str | None] | None = None,
    hard_negative_ids: Sequence[str | None] | None = None,
    out_dir: str | Path | None = None,
    provenance: dict | None = None,
    work_dir: str | Path | None = None,
    keep_work: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> RetrieverResult:
    """Trains the dual encoder with in-batch softmax (non-private).

    Args:
      encoder: the base encoder (its params initialise every tower).
      queries, documents: the training pairs (row i is a pair).
      config: hyper-parameters.
      doc_ids: document identities (pairs sharing a document are not each other's
        negatives); default: the document text.
      hard_negatives: one document text per pair (`retriever.negatives`), added to the
        batch's negatives; None for a pair without one. A query's own document is masked.
      hard_negative_ids: their identities, like `doc_ids` (required with `doc_ids`).
      out_dir: the release folder: the trained encoder once complete (`save_trained`).
      provenance: what the pairs are (`retriever.provenance`); default: real data, no
        guarantee. Written to out_dir/provenance.json.
      work_dir: the run's resume state (orbax checkpoints), outside the release; with
        `out_dir`, default `synthgen.paths.default_work_dir(out_dir)`.
      keep_work: keep the work folder after a finished run (an interrupted run keeps it).
      progress: show a progress bar.
      stop_after: stop after this many steps in total (to test resumption).

    Raises:
      ValueError: bad pairs, or a work folder holding another run's checkpoints.

    Privacy:
      None is spent here. Trained on DP synthetic pairs this is post-processing of the
      generator's release and inherits its guarantee (state it with `provenance`); trained
      on real pairs it is the non-private reference.
    """
    _check_pairs(queries, documents, config.batch_size)
    n = len(queries)
    keys = [str(k) for k in (doc_ids if doc_ids is not None else documents)]
    if hard_negatives is not None and doc_ids is not None and hard_negative_ids is None:
        raise ValueError("with doc_ids, give hard_negative_ids too (the same kind of identity)")
    negative_texts, negative_keys = _negatives(documents, hard_negatives, hard_negative_ids, n)
    present = [i for i, key in enumerate(negative_keys) if key is not None]
    named = keys + [negative_keys[i] for i in present]
    _, key_index = np.unique(np.asarray(named, dtype=object), return_inverse=True)
    data = _tokenize_pairs(encoder, queries, documents, config)
    data["doc_key"] = key_index[:n].astype(np.int32)
    if hard_negatives is not None:
        neg = encoder.tokenize(negative_texts, config.max_doc_len)
        data["n_ids"], data["n_mask"] = neg["input_ids"], neg["attention_mask"]
        data["n_key"] = np.full(n, -1, np.int32)  # -1: no negative, masked for every query
        data["n_key"][present] = key_index[n:]
    steps_per_epoch = n // config.batch_size
    total = max(1, int(round(config.epochs * steps_per_epoch)))

    params = {"query": encoder.params}
    if config.separate_towers:
        params["doc"] = jax.tree.map(jnp.copy, encoder.params)
    params["log_scale"] = jnp.log(jnp.float32(1.0 / config.temperature))
    optimizer = optax.adamw(_schedule(config, total), weight_decay=config.weight_decay)
    if not config.learn_temperature:
        labels = jax.tree.map(lambda _: "train", params)
        labels["log_scale"] = "fixed"
        optimizer = optax.multi_transform(
            {"train": optimizer, "fixed": optax.set_to_zero()}, labels
        )
    opt_state = optimizer.init(params)
    step = 0
    manager = work = None
    run_meta = {
        "config": dataclasses.asdict(config),
        "data": _pairs_digest(data),
        "start": params_sha256(encoder.params),  # the weights training started from
    }
    if out_dir is not None:
        work = Path(work_dir) if work_dir is not None else default_work_dir(out_dir)
        manager = TrainCheckpoints(private_folder(private_folder(work) / CHECKPOINTS))
        restored = manager.restore_latest(params, opt_state)
        if restored is not None:
            if {k: restored.meta.get(k) for k in run_meta} != run_meta:
                manager.close()
                raise ValueError(
                    f"the work folder {work} holds checkpoints of a different run (config, "
                    "training pairs or starting encoder): remove it or pass another work folder"
                )
            params, opt_state, step = restored.trainable, restored.opt_state, restored.step

    mesh = Mesh(np.array(jax.devices()), ("data",))
    if config.batch_size % jax.device_count():
        raise ValueError(f"batch_size={config.batch_size} must be a multiple of the device count")
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(opt_state, replicated)

    def loss_fn(params, batch):
        query_tower, doc_tower = _towers(params)

        def embed(tower, side):  # side: "q", "d" or "n" (the hard negatives)
            tokens = {"input_ids": batch[f"{side}_ids"], "attention_mask": batch[f"{side}_mask"]}
            return encoder.apply(tower, tokens)

        q, d = embed(query_tower, "q"), embed(doc_tower, "d")
        scale = jnp.exp(params["log_scale"])
        if "n_ids" not in batch:
            return in_batch_softmax_loss(q, d, batch["doc_key"], scale)
        negatives = embed(doc_tower, "n")
        return in_batch_softmax_loss(q, d, batch["doc_key"], scale, negatives, batch["n_key"])

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    last = total if stop_after is None else min(total, stop_after)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="retriever-train", unit="step")
    losses: list[float] = []
    start, seen = time.time(), 0
    while step < last:
        epoch, within = divmod(step, steps_per_epoch)
        order = np.random.default_rng([config.seed, epoch]).permutation(n)
        rows = order[within * config.batch_size : (within + 1) * config.batch_size]
        batch = jax.device_put({k: v[rows] for k, v in data.items()}, sharded)
        params, opt_state, loss = train_step(params, opt_state, batch)
        step += 1
        seen += config.batch_size
        losses.append(float(loss))
        if bar is not None:
            bar.update(1)
            shown = {"pairs_s": f"{seen / max(time.time() - start, 1e-9):.1f}"}
            if (provenance or {}).get("trained_on", {}).get("kind") == "dp-synthetic":
                shown["loss"] = f"{losses[-1]:.3f}"  # a loss on real pairs is private data
            bar.set_postfix(shown)
        if manager is not None and (step % config.checkpoint_every == 0 or step == last):
            manager.save(step, params, opt_state, None, run_meta)
    if bar is not None:
        bar.close()
    if manager is not None:
        manager.close()
    seconds = time.time() - start
    result = RetrieverResult(
        jax.device_get(params),
        losses,
        step,
        total,
        seconds,
        seen / max(seconds, 1e-9),
        pairs_left_out_per_epoch=n % config.batch_size,
    )
    if out_dir is not None and step == total:
        if provenance is None:
            provenance = prov.real_data(num_pairs=n)
        extra = {"training": _summary(config, result)}
        save_trained(encoder, result.params, out_dir, extra, provenance=provenance)
        if work is not None and not keep_work:
            shutil.rmtree(work, ignore_errors=True)  # resume state of a finished run
    return result


def _pairs_digest(data: dict[str, np.ndarray]) -> str:
    """SHA-256 of the tokenized pairs: a resumed run must train on the same pairs. Kept in
    the work folder only."""
    digest = hashlib.sha256()
    for key in sorted(data):
        array = np.ascontiguousarray(data[key])
        digest.update(f"{key}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _summary(config: RetrieverConfig, result: RetrieverResult) -> dict:
    return {
        "config": dataclasses.asdict(config),
        "steps": result.steps_run,
        "seconds": result.seconds,
        "pairs_per_second": result.pairs_per_second,
        "pairs_left_out_per_epoch": result.pairs_left_out_per_epoch,
        "temperature": float(1.0 / np.exp(result.params["log_scale"])),
    }


def save_trained(
    encoder: TextEncoder,
    params: dict,
    out_dir: str | Path,
    extra: dict,
    *,
    provenance: dict,
) -> None:
    """Writes the query tower to out_dir and, if separate, the document tower to
    out_dir/doc_tower (both loadable with `retriever.encoders.load_encoder`), each with
    ``provenance.json`` (`provenance` with the base model's name filled in)."""
    out = Path(out_dir)
    if encoder.origin is not None:  # weights from a folder: what they were trained on counts
        provenance = prov.continued_from(prov.encoder_provenance(encoder.origin), provenance)
    record = {**provenance, "base_model": encoder.name}
    save_encoder(encoder, params["query"], out, extra=extra)
    prov.write_provenance(out, record)
    if "doc" in params:
        save_encoder(encoder, params["doc"], out / DOC_TOWER_DIR, extra=extra)
        prov.write_provenance(out / DOC_TOWER_DIR, record)


def train_retriever_dp(
    encoder: TextEncoder,
    queries: Sequence[str],
    positive_index: Sequence[int],
    corpus_texts: Sequence[str],
    config: RetrieverConfig,
    dp_config: dp_train.DPConfig,
    *,
    out_dir: str | Path | None = None,
    pay: Payer | None = None,
    work_dir: str | Path | None = None,
    keep_work: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    plan: dp_train.PrivacyPlan | None = None,
) -> dp_train.TrainResult:
    """The direct-DP baseline: DP-Adafactor on real pairs, frozen public document tower.

    Args:
      encoder: the base encoder; its params initialise the query tower and stay the
        document tower.
      queries: private queries; `positive_index[i]` is the row of query i's document in
        `corpus_texts` (the public corpus, whose embeddings are every query's candidates).
      config: token budgets and temperature (`batch_size`/`epochs` come from `dp_config`).
      dp_config: DP-Adafactor hyper-parameters (sigma or target epsilon, C, sampling).
      out_dir: the release folder: the trained towers, the privacy metadata and
        provenance.json (`retriever.provenance.dp_sgd`, with the scope charged).
      pay: the run's payer, charged (once) before the first step; an over-budget run is
        refused before the corpus is embedded. With `out_dir` or `work_dir`,
        `synthgen.work_folder.run_payer` (its work folder is the run's); with neither,
        `synthgen.privacy.receipts.ledger_payer`. None: not charged.
      work_dir: private work folder (checkpoints, noise key, sampler state, charge
        record): the payer's, else with `out_dir` `synthgen.paths.default_work_dir(out_dir)`.
        Calling again with the same folders resumes an interrupted run.
      keep_work: keep the work folder after a finished run (it stays secret); by default
        it is deleted once the release is written.
      progress: show progress bars.
      stop_after: stop after this many steps (to test resumption).
      plan: precomputed `dp_train.plan_privacy(dp_config, len(queries))`.

    Privacy:
      (epsilon, delta)-DP w.r.t. one (query, document) pair, add/remove-one, see the module
      docstring: the per-example loss is a softmax over the public corpus embeddings, so
      each pair's clipped gradient is its only influence (sensitivity C). Nothing of the
      mechanism's randomness and no loss or timing goes to `out_dir`.
    """
    if len(queries) != len(positive_index):
        raise ValueError(f"{len(queries)=} queries for {len(positive_index)=} positives")
    if plan is None:
        plan = dp_train.plan_privacy(dp_config, len(queries))
    index = np.asarray(positive_index, np.int32)
    if index.min() < 0 or index.max() >= len(corpus_texts):
        raise ValueError("positive_index points outside the corpus")
    if isinstance(pay, OncePayer):  # a run payer keeps its charge in the work folder
        if work_dir is not None and Path(work_dir).resolve() != pay.work.path.resolve():
            raise ValueError(f"work_dir={work_dir} is not the payer's work folder {pay.work.path}")
        work_dir = pay.work.path
    if work_dir is None and out_dir is not None:
        work_dir = default_work_dir(out_dir)
    if work_dir is not None and out_dir is not None:
        check_apart(out_dir, work_dir)  # else the release would ship the noise key
    work = None if work_dir is None else WorkFolder(work_dir)
    if pay is not None and work is not None and not isinstance(pay, OncePayer):
        raise ValueError(
            "a run with a work folder (out_dir or work_dir) is paid by its run payer "
            "(synthgen.work_folder.run_payer), which charges once across resumes"
        )
    if pay is not None:
        if not plan.private:
            raise ValueError("a non-private run (noise_multiplier=0) cannot be charged to a ledger")
        pay.check(plan)  # refuse an over-budget run before embedding the corpus
    doc_emb = encoder.encode(list(corpus_texts), max_len=config.max_doc_len, progress=progress)
    tokens = encoder.tokenize(list(queries), config.max_query_len)
    data = {
        "input_ids": tokens["input_ids"],
        "attention_mask": tokens["attention_mask"],
        "positive": index,
    }
    scale = 1.0 / config.temperature

    def loss(trainable, frozen, ex):
        q = encoder.apply(
            trainable,
            {"input_ids": ex["input_ids"][None], "attention_mask": ex["attention_mask"][None]},
        )[0]
        logits = scale * (frozen["doc_embeddings"] @ q)
        return -jax.nn.log_softmax(logits)[ex["positive"]]

    result = dp_train.train(
        loss,
        encoder.params,
        {"doc_embeddings": jnp.asarray(doc_emb)},
        data,
        dp_config,
        work_dir=None if work is None else work.path,
        pay=pay,
        description=f"retriever direct-DP baseline n={len(queries)}",
        progress=progress,
        stop_after=stop_after,
        plan=plan,
    )
    if result.steps_run < plan.steps:
        return result  # interrupted on purpose; the work folder stays: call again to resume
    if out_dir is not None:
        privacy = plan.to_dict()
        privacy.update(
            seeded=dp_config.seed is not None,  # the noise from a fixed seed: tests only
            unit="one (query, document) pair",
            mechanism="DP-Adafactor on a per-example softmax over public corpus embeddings "
            "(frozen document tower)",
        )
        privacy = json.loads(json.dumps(privacy, default=str))
        used = ("temperature", "max_query_len", "max_doc_len")  # the rest is dp_config's
        trained = {k: v for k, v in dataclasses.asdict(config).items() if k in used}
        dp = {k: v for k, v in dataclasses.asdict(dp_config).items() if k != "seed"}
        extra = {"privacy": privacy, "training": {"config": {**trained, "dp": dp}}}
        charged = {"ledger_scope": None if pay is None else pay.scope}
        record = prov.dp_sgd({**privacy, **charged}, num_pairs=len(queries))
        towers = {"query": result.trainable, "doc": encoder.params}
        save_trained(encoder, towers, out_dir, extra, provenance=record)
    if work is not None and not keep_work:
        work.discard()  # the release is complete: the secret resume state goes
    return result
