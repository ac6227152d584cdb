"""Black-box one-run audit of the query generator: canaries with power (Panda et al. 2025).

What is audited: the released generator (the final weights only), trained by the project's
DP-Adafactor (`synthgen.dp_train.train`, its sampler and accountant) on private pairs plus
m canaries (default 1,000), each inserted exactly once with probability 1/2. A canary is a
public (document, query) row held out of the private pairs, its query followed by a secret
of 1-3 tokens: NEW vocabulary tokens with trainable rows (kind `new`, `new_tokens`), or the
existing tokens least likely as a first query token (kind `rare`, weaker under LoRA). Score:
log p_trained(secret | prefix) - log p_base(secret | prefix), over the secret tokens only;
statistics by `whitebox.score_stats`. One 128-bit audit seed spawns the canary material,
the coins and the training seed (`coins.streams`). See docs/guides/audits.md ("Black-box
canaries with power").

Privacy:
  Unit: one (document, query) pair (a canary is one pair), add/remove-one, Poisson
  sampling; queries are private, documents public. The plan is made for the private pairs
  plus all m canaries (a public size fixed before the coins) at a fixed Poisson rate
  (`dp_train.train(fixed_rate=True)`), so the mechanism, sizes, steps and compiled shapes
  do not depend on the coins. The coins and per-canary scores live in memory only and are
  dropped before return (a cell resumes whole, with fresh coins); only `BlackboxResult`
  aggregates leave. The audited runs are never released and not charged to a ledger;
  publishing the aggregates of a run at epsilon costs that epsilon, and the epsilon = inf
  run is NOT private.

References: Panda, Tang, Mahloujifar, Sehwag, Mittal 2025 (arXiv 2503.06808: new-token and
rare-token canaries, loss on the secret); Steinke, Nasr & Jagielski 2023 (arXiv 2305.08846);
Mahloujifar, Melis & Chaudhuri 2024 (arXiv 2410.22235).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from synthgen import dp_train, run_seed
from synthgen.audit.coins import draw_coins, streams
from synthgen.audit.exposure import token_scores
from synthgen.audit.new_tokens import embedding_paths, extend_vocabulary
from synthgen.audit.whitebox import CellResult, canary_figures

KINDS = ("new", "rare")
OBSERVABLE = "secret_log_ratio"
PyTree = Any


@dataclasses.dataclass(frozen=True)
class BlackboxConfig:
    """One black-box cell: the canaries and the audited run's training.

    Attributes:
      num_canaries: m, each inserted once with probability 1/2.
      kind: "new" (new vocabulary tokens, trainable rows) or "rare" (rarest existing tokens).
      secret_len: (shortest, longest) secret in tokens, each canary's length uniform in it.
      epsilon: the run's target epsilon; `math.inf` is the non-private run (no noise).
      delta: delta of the run's claim and of every bound.
      epochs: epochs of the audited run over the planned size (pairs + m).
      learning_rate, clip_norm, batch_size: None: the generator preset's (a larger expected
        batch at the same epochs gives the same claim with more noise per step but fewer
        steps: the auditor's choice, stated with the result).
      no_clipping: the non-private run without clipping (clip norm 1e6); refused with noise.
      rare_pool: size of the rare-token pool (kind "rare").
      significance: level of each bound (0.05: 95%).
      score_batch: canaries per scoring pass.
      seed: None (production): a 128-bit audit seed from OS entropy; fixed seeds: tests only.
    """

    num_canaries: int = 1000
    kind: str = "new"
    secret_len: tuple[int, int] = (1, 3)
    epsilon: float = math.inf
    delta: float = 1e-5
    epochs: float = 1.0
    learning_rate: float | None = None
    batch_size: int | None = None
    clip_norm: float | None = None
    no_clipping: bool = False
    rare_pool: int = 4096
    significance: float = 0.05
    score_batch: int = 16
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.num_canaries < 2:
            raise ValueError(f"num_canaries must be >= 2, got {self.num_canaries=}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind=}")
        lo, hi = self.secret_len
        if not 1 <= lo <= hi:
            raise ValueError(
                f"secret_len must be (lo, hi) with 1 <= lo <= hi, got {self.secret_len=}"
            )
        if math.isnan(self.epsilon) or not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0 or inf, got {self.epsilon=}")
        if self.no_clipping and math.isfinite(self.epsilon):
            raise ValueError("no_clipping is for the non-private run only (epsilon = inf)")
        if not 0 < self.delta < 1 or 2 * self.num_canaries * self.delta > 1:
            raise ValueError(f"delta must be in (0, 1/(2 m)], got {self.delta=}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size=}")
        if not self.epochs > 0 or self.rare_pool < 2 or self.score_batch < 1:
            raise ValueError(f"bad sizes: {self.epochs=}, {self.rare_pool=}, {self.score_batch=}")
        if not 0 < self.significance < 0.5:
            raise ValueError(f"significance must be in (0, 0.5), got {self.significance=}")
        if self.seed is not None:
            run_seed.check_seed(self.seed)


# ---- canaries ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Canaries:
    """The m canaries: public material only (no coins). Token ids, not text."""

    documents: tuple[str, ...]
    prefixes: tuple[tuple[int, ...], ...]
    secrets: tuple[tuple[int, ...], ...]
    num_new: int

    def __len__(self) -> int:
        return len(self.documents)


def rare_pool(
    family,
    params: PyTree,
    documents: Sequence[str],
    size: int,
    *,
    input_len: int,
    target_len: int,
) -> np.ndarray:
    """The `size` ordinary tokens least likely as the first query token after public prompts.

    The base model's log-probabilities are averaged over up to 8 public documents' prompts;
    special ids and ids outside the tokenizer's vocabulary (padding rows) are left out.
    """
    tok = family.tokenizer
    docs = list(documents[:8]) or [""]
    data = family.encode_pairs(docs, ["x"] * len(docs), input_len, target_len)
    logits_fn = jax.jit(jax.vmap(family.logits_fn(), in_axes=(None, 0)))
    logp = jax.nn.log_softmax(logits_fn(params, data)[:, 0].astype(jnp.float32), axis=-1)
    mean = np.asarray(logp.mean(axis=0))
    special = {tok.eos_id, tok.pad_id, tok.bos_id}
    usable = [int(t) for t in np.argsort(mean) if int(t) < tok.vocab_size and int(t) not in special]
    if len(usable) < 2:
        raise ValueError("fewer than 2 usable tokens for a rare-token pool")
    return np.asarray(usable[:size], np.int64)


def make_canaries(
    family,
    sources_documents: Sequence[str],
    sources_queries: Sequence[str],
    config: BlackboxConfig,
    rng: np.random.Generator,
    *,
    base_vocab: int,
    target_len: int,
    pool: np.ndarray | None = None,
) -> Canaries:
    """m canaries from public (document, query) rows: the query's tokens, then the secret.

    The query prefix is cut so that prefix + secret + end of query fit in `target_len`.

    Args:
      family: the generator's family (its tokenizer encodes the prefixes).
      sources_documents, sources_queries: m public rows (held out of the private pairs).
      config: the cell (m, kind, secret lengths).
      rng: the public canary-material stream.
      base_vocab: V; `new` secrets use ids V, V + 1, ... (one per secret position).
      target_len: the generator's target budget.
      pool: `rare` only: the rare-token pool (`rare_pool`).
    """
    m = config.num_canaries
    if len(sources_documents) != m or len(sources_queries) != m:
        raise ValueError(f"need {m} canary source rows, got {len(sources_documents)}")
    lo, hi = config.secret_len
    if hi + 2 > target_len:
        raise ValueError(f"secrets of {hi} tokens need target_len >= {hi + 2}, got {target_len=}")
    lengths = rng.integers(lo, hi + 1, m)
    total = int(lengths.sum())
    if config.kind == "new":
        flat = base_vocab + np.arange(total)
        num_new = total
    else:
        if pool is None or len(pool) < 2:
            raise ValueError("rare canaries need a rare-token pool of >= 2 tokens")
        flat = rng.choice(pool, total, replace=total > len(pool))
        num_new = 0
    secrets, at = [], 0
    for n in lengths:
        secrets.append(tuple(int(t) for t in flat[at : at + n]))
        at += int(n)
    prefixes = []
    for query, secret in zip(sources_queries, secrets, strict=True):
        ids = family.tokenizer.encode(str(query))[: target_len - 1 - len(secret)]
        prefixes.append(tuple(int(t) for t in ids))
    return Canaries(tuple(map(str, sources_documents)), tuple(prefixes), tuple(secrets), num_new)


def encode_canaries(family, canaries: Canaries, *, input_len: int, target_len: int) -> dict:
    """The canaries as training rows of the family (same keys and shapes as `encode_pairs`),
    plus `secret_mask` [m, target_len]: 1 at the target positions that are secret tokens."""
    documents = list(canaries.documents)
    placeholder = family.encode_pairs(documents, ["x"] * len(documents), input_len, target_len)
    tok = family.tokenizer
    eos, pad = tok.eos_id, tok.pad_id
    targets = np.full((len(canaries), target_len), pad, np.int32)
    target_mask = np.zeros((len(canaries), target_len), np.float32)
    secret_mask = np.zeros((len(canaries), target_len), np.float32)
    for i, (prefix, secret) in enumerate(zip(canaries.prefixes, canaries.secrets, strict=True)):
        ids = [*prefix, *secret, eos]
        targets[i, : len(ids)] = ids
        target_mask[i, : len(ids)] = 1.0
        secret_mask[i, len(prefix) : len(prefix) + len(secret)] = 1.0
    data = dict(placeholder)
    data["targets"], data["target_mask"] = targets, target_mask
    if "tokens" in data:  # decoder-only: the targets follow the prompt in the token row
        tokens = np.array(data["tokens"])
        attention = np.array(data["attention_mask"])
        for i in range(len(canaries)):
            start = int(data["target_start"][i]) + 1  # the first target token's slot
            tokens[i, start:] = pad
            attention[i, start:] = 0.0
            n = int(target_mask[i].sum())
            tokens[i, start : start + n] = targets[i, :n]
            attention[i, start : start + n] = 1.0
        data["tokens"], data["attention_mask"] = tokens, attention
    data["secret_mask"] = secret_mask
    return data


def score_secrets(family, params: PyTree, data: dict, *, batch: int) -> np.ndarray:
    """log p(secret | prefix) in nats per canary: the sum over its secret tokens only."""
    logp, _ = token_scores(family, params, data, batch_size=batch)
    return (logp * data["secret_mask"]).sum(axis=1).astype(np.float64)


# ---- the audited run --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlackboxResult(CellResult):
    """The aggregate figures of one black-box cell (what a report may show)."""

    kind: str
    num_private: int
    num_new_tokens: int
    steps: int
    epochs: float
    batch_size: int
    learning_rate: float
    clip_norm: float
    noise_multiplier: float
    train_seconds: float
    score_seconds: float


def run_config(dp: dp_train.DPConfig, config: BlackboxConfig, seed: int) -> dp_train.DPConfig:
    """The audited run's DP config: the preset's, with the cell's epsilon, epochs, batch and
    seed."""
    private = math.isfinite(config.epsilon)
    clip = 1e6 if config.no_clipping else (config.clip_norm or dp.clip_norm)
    return dataclasses.replace(
        dp,
        epochs=config.epochs,
        learning_rate=config.learning_rate or dp.learning_rate,
        batch_size=config.batch_size or dp.batch_size,
        clip_norm=clip,
        noise_multiplier=None if private else 0.0,
        target_epsilon=config.epsilon if private else None,
        delta=config.delta,
        sampling="poisson",
        per_example_norms="vmap",
        seed=seed,
    )


def audit_querygen(
    family,
    params: PyTree,
    private_documents: Sequence[str],
    private_queries: Sequence[str],
    canary_documents: Sequence[str],
    canary_queries: Sequence[str],
    dp: dp_train.DPConfig,
    config: BlackboxConfig,
    *,
    input_len: int,
    target_len: int,
    lora: bool,
    model: str = "",
    progress: bool = False,
) -> BlackboxResult:
    """Trains the generator on the private pairs plus the inserted canaries; audits the claim.

    Args:
      family, params: the base generator (`querygen.load_base`).
      private_documents, private_queries: the private pairs.
      canary_documents, canary_queries: m public rows held out of the private pairs.
      dp: the generator preset's DP config (batch, microbatches; see `run_config`).
      config: the cell.
      input_len, target_len: the generator's token budgets.
      lora: the base trainable tree is the LoRA adapters.
      model: a public label for the report.
      progress: dp_train's progress bar (steps and epsilon only).

    Returns:
      The `BlackboxResult` (aggregates only).

    Privacy:
      See the module docstring: the run is (epsilon, delta)-DP w.r.t. one pair by
      `dp_train.train`'s plan for n + m pairs; the coins and scores never leave this call.
    """
    start = time.perf_counter()
    material, coin_rng, train_seed = streams(config.seed)
    m = config.num_canaries
    pool = None
    if config.kind == "rare":
        pool = rare_pool(
            family,
            params,
            canary_documents,
            config.rare_pool,
            input_len=input_len,
            target_len=target_len,
        )
    embed_path = embedding_paths(params)[0]
    base_vocab = int(traverse_util.flatten_dict(params)[embed_path].shape[0])
    canaries = make_canaries(
        family,
        canary_documents,
        canary_queries,
        config,
        material,
        base_vocab=base_vocab,
        target_len=target_len,
        pool=pool,
    )
    ext = extend_vocabulary(family, params, canaries.num_new, lora=lora, rng=material)
    canary_rows = encode_canaries(ext.family, canaries, input_len=input_len, target_len=target_len)
    private = ext.family.encode_pairs(
        list(private_documents), list(private_queries), input_len, target_len
    )
    run = run_config(dp, config, train_seed)
    plan = dp_train.plan_privacy(run, len(private_documents) + m)  # public: before the coins

    def score(trainable: PyTree) -> np.ndarray:  # log p(secret | prefix) per canary
        weights = ext.full_params(trainable)
        return score_secrets(ext.family, weights, canary_rows, batch=config.score_batch)

    base = score(ext.trainable)
    coins = draw_coins(coin_rng, m)
    data = {k: np.concatenate([private[k], canary_rows[k][coins]]) for k in private}
    trained_start = time.perf_counter()
    result = dp_train.train(
        ext.loss_fn(),
        ext.trainable,
        ext.frozen,
        data,
        run,
        lora=lora,
        progress=progress,
        plan=plan,
        fixed_rate=True,
    )
    del data
    train_seconds = time.perf_counter() - trained_start
    score_start = time.perf_counter()
    trained = score(result.trainable)
    score_seconds = time.perf_counter() - score_start
    figures = canary_figures(
        {OBSERVABLE: trained - base},
        coins,
        target_epsilon=config.epsilon,
        claimed_epsilon=plan.epsilon,
        delta=plan.delta,
        significance=config.significance,
    )
    del coins, trained, base, result
    return BlackboxResult(
        model=model,
        kind=config.kind,
        num_private=len(private_documents),
        num_new_tokens=canaries.num_new,
        steps=plan.steps,
        epochs=config.epochs,
        batch_size=run.batch_size,
        learning_rate=run.learning_rate,
        clip_norm=run.clip_norm,
        noise_multiplier=plan.noise_multiplier,
        train_seconds=train_seconds,
        score_seconds=score_seconds,
        seconds=time.perf_counter() - start,
        **figures,
    )
