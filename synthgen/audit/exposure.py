"""Secret exposure (Carlini et al. 2019): rank, exposure, its extrapolation, and extraction.

A secret's log-perplexity (bits) given its context under the trained generator is ranked
among reference secrets from the same space with the same context:

  rank      = 1 + #{references with strictly lower log-perplexity}
  exposure  = log2(space size) - log2(rank)     (space size defaults to #references)

`extrapolated_exposure` fits a skew-normal to the references to reach the whole space
(Carlini et al., Sec. 4.3). Extraction (greedy decoding reproduces the secret) is read from
the same teacher-forced pass: the argmax is the secret's token at every secret position.

Privacy:
  Scores are computed on canaries, which are not private data; the per-canary scores and
  which canaries were inserted stay in the private work folder (see `canaries`).

References: Carlini, Liu, Erlingsson, Kos, Song 2019, "The Secret Sharer: Evaluating and
Testing Unintended Memorization in Neural Networks".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

_LOG2 = math.log(2.0)


def _references(reference_perplexities) -> np.ndarray:
    refs = np.asarray(reference_perplexities, dtype=np.float64).ravel()
    if refs.size == 0:
        raise ValueError("at least one reference perplexity is needed")
    if not np.all(np.isfinite(refs)):
        raise ValueError("reference perplexities must be finite")
    return refs


def rank(secret_perplexity: float, reference_perplexities: Sequence[float]) -> int:
    """1 + the number of references with strictly lower log-perplexity than the secret."""
    if not math.isfinite(secret_perplexity):
        raise ValueError(f"the secret's perplexity must be finite, got {secret_perplexity=}")
    refs = _references(reference_perplexities)
    return 1 + int(np.sum(refs < secret_perplexity))


def exposure(
    secret_perplexity: float,
    reference_perplexities: Sequence[float],
    space_size: float | None = None,
) -> float:
    """log2(space size) - log2(rank of the secret among the references).

    Args:
      secret_perplexity: log-perplexity of the inserted secret given its context.
      reference_perplexities: log-perplexities of reference secrets from the same space,
        each given the same context.
      space_size: size of the secret space; default the number of references.

    Returns:
      The exposure in bits: log2(space size) when no reference is more likely than the
      secret, about 0 when the secret is as likely as a typical reference.
    """
    refs = _references(reference_perplexities)
    size = refs.size if space_size is None else space_size
    if not size >= 1:
        raise ValueError(f"space_size must be >= 1, got {space_size=}")
    return math.log2(size) - math.log2(rank(secret_perplexity, refs))


def extrapolated_exposure(
    secret_perplexity: float,
    reference_perplexities: Sequence[float],
    space_size: float = 1e10,
) -> float:
    """Exposure over the whole secret space from a skew-normal fit (Carlini et al. 2019).

    The reference log-perplexities are fitted with a skew-normal distribution; the exposure
    is -log2 of the fitted probability that a random secret is at most as perplexing as the
    inserted one, capped at log2(space_size) (the rank cannot be below 1).

    Raises:
      ValueError: fewer than 3 references, or references that are all equal.
    """
    refs = _references(reference_perplexities)
    if refs.size < 3 or np.ptp(refs) == 0:
        raise ValueError("the skew-normal fit needs >= 3 references that are not all equal")
    shape, loc, scale = scipy.stats.skewnorm.fit(refs)
    log_cdf = float(scipy.stats.skewnorm.logcdf(secret_perplexity, shape, loc, scale))
    return float(min(max(-log_cdf / _LOG2, 0.0), math.log2(space_size)))


# ---- scoring under a trained generator -------------------------------------------------------


def group_figures(ppl: np.ndarray, idx: Sequence[int], space_sizes: Sequence[float]) -> dict:
    """Exposure of the canaries `idx` (`ppl[i]`: the secret's, then the references' bits).

    The count, the references, the median rank, the median and largest exposure and the
    median extrapolated exposure (`space_sizes[j]`: canary idx[j]'s secret space).
    """
    exp = [exposure(ppl[i, 0], ppl[i, 1:]) for i in idx]
    ext = [extrapolated_exposure(ppl[i, 0], ppl[i, 1:], n) for i, n in zip(idx, space_sizes)]
    return {
        "canaries": len(idx),
        "references": int(ppl.shape[1] - 1),
        "median_rank": float(np.median([rank(ppl[i, 0], ppl[i, 1:]) for i in idx])),
        "median_exposure": float(np.median(exp)),
        "max_exposure": float(np.max(exp)),
        "median_extrapolated_exposure": float(np.median(ext)),
    }


@dataclasses.dataclass(frozen=True)
class SequenceScores:
    """Per-sequence scores of (document, query) pairs under one model.

    Attributes:
      log_perplexity: -log2 p(query | document), summed over the query's tokens (bits).
      greedy_secret: the greedy next token equals the query's token at every position from
        `secret_start` to the last token before the end of the query.
    """

    log_perplexity: np.ndarray
    greedy_secret: np.ndarray


def score_sequences(
    family,
    params,
    documents: Sequence[str],
    queries: Sequence[str],
    *,
    secret_start: Sequence[int] | None = None,
    input_len: int,
    target_len: int,
    batch_size: int = 16,
    progress: bool = False,
    description: str = "score",
) -> SequenceScores:
    """Scores `queries` given `documents` under a query-generator model, in jitted batches.

    Args:
      family: a `synthgen.generator_models` family (T5Family or LlamaFamily).
      params: the model's full parameters.
      documents, queries: the pairs to score, as the generator was trained on them.
      secret_start: per pair, the index of the first query token that belongs to the secret
        (tokens before it are the key words); default 0 (the whole query).
      input_len, target_len: the generator's token budgets.
      batch_size: pairs per forward pass (the last batch is padded: one compiled shape).

    Raises:
      ValueError: a query longer than `target_len` tokens (it would be cut, and the score
        would not be the secret's).
    """
    if len(documents) != len(queries):
        raise ValueError(f"{len(documents)=} != {len(queries)=}")
    tok = family.tokenizer
    for query in queries:
        if len(tok.encode(query)) + 1 > target_len:
            raise ValueError(
                f"a canary query needs {len(tok.encode(query)) + 1} tokens > {target_len=}: "
                "raise the config's target_len"
            )
    starts = np.zeros(len(queries), np.int32) if secret_start is None else np.asarray(secret_start)
    data = family.encode_pairs(documents, queries, input_len, target_len)
    logp, hit = token_scores(
        family, params, data, batch_size=batch_size, progress=progress, description=description
    )
    mask = data["target_mask"]
    bits = -(logp * mask).sum(axis=1) / _LOG2
    positions = np.arange(target_len)[None, :]
    ends = mask.sum(axis=1, keepdims=True) - 1  # the end-of-query token is not secret
    secret = (positions >= starts[:, None]) & (positions < ends)
    greedy = np.all(hit | ~secret, axis=1)
    return SequenceScores(log_perplexity=bits.astype(np.float64), greedy_secret=greedy)


def token_scores(
    family,
    params,
    data: dict[str, np.ndarray],
    *,
    batch_size: int,
    progress: bool = False,
    description: str = "score",
) -> tuple[np.ndarray, np.ndarray]:
    """Per encoded row (`family.encode_pairs`' keys) and target position: the target token's
    log-probability (nats) and whether it is the greedy token, in jitted batches of
    `batch_size` (the last one padded: one compiled shape)."""
    from tqdm.auto import tqdm

    logits_fn = family.logits_fn()

    def one(params, ex):
        logits = logits_fn(params, ex).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        target_logp = jnp.take_along_axis(logp, ex["targets"][:, None], axis=-1)[:, 0]
        return target_logp, jnp.argmax(logits, axis=-1) == ex["targets"]

    step = jax.jit(jax.vmap(one, in_axes=(None, 0)))
    n = len(data["targets"])
    logp = np.zeros(np.shape(data["targets"]), np.float32)
    hit = np.zeros(np.shape(data["targets"]), bool)
    for begin in tqdm(range(0, n, batch_size), desc=description, disable=not progress):
        idx = np.arange(begin, min(begin + batch_size, n))
        padded = np.concatenate([idx, np.full(batch_size - len(idx), idx[-1])])
        batch = {k: jnp.asarray(v[padded]) for k, v in data.items()}
        batch_logp, batch_hit = jax.device_get(step(params, batch))
        logp[idx], hit[idx] = batch_logp[: len(idx)], batch_hit[: len(idx)]
    return logp, hit
