"""Keywords of a knowledge release: per record (public rule), then the two DP histograms.

* `record_keywords`: each record's at most K keywords by a public rule that reads that
  record only (`synthgen.fewshot.topics.document_keywords`: distinct words of 5+ letters
  outside a stop list, the rarest-looking first, i.e. the most tokens).
* `release_keywords` (stage 1): PipelineDP's partition selection with counts
  (`synthgen.privacy.partition_selection`). Invented names are private strings: a keyword
  that few records hold is never released.
* `release_cluster_keywords` (stage 2): for every cluster (a released keyword), the noisy
  counts of the released keywords its records also hold; the top ones above a public
  threshold name the cluster's topic.

Privacy:
  Unit: one record, add/remove-one. Stage 1: sensitivity sqrt(K) (each keyword once, at most
  K). Stage 2: the domain (clusters x released keywords) is public after stage 1; a record
  sits in at most L clusters and adds at most K - 1 other keywords to each, +1 each: L2
  sensitivity sqrt(L (K - 1)); the Gaussian mechanism releases the whole count matrix, and
  naming the top entries is post-processing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from synthgen.fewshot.topics import document_keywords
from synthgen.knowledge.plan import KnowledgePlan
from synthgen.privacy import mechanisms
from synthgen.privacy.partition_selection import KeyCountRelease, release_key_counts


def record_keywords(
    texts: Sequence[str],
    *,
    max_keywords: int,
    token_count: Callable[[str], int],
    min_tokens: int = 1,
) -> list[list[str]]:
    """Each record's at most `max_keywords` keywords (a function of that record only).

    With `min_tokens` > 1, a word the LM's tokenizer writes in fewer tokens is left out:
    one token means a common word ("swelling", "cough"), which names no private topic.
    """

    def rare(word: str) -> int:
        n = token_count(word)
        return n if n >= min_tokens else 0

    out = []
    for text in texts:
        words = document_keywords(text, max_keywords=10**6, token_count=token_count)
        out.append([w for w in words if rare(w)][:max_keywords])
    return out


def release_keywords(keywords: Sequence[Sequence[str]], plan: KnowledgePlan) -> KeyCountRelease:
    """Stage 1: the keywords many records share, with noisy counts (PipelineDP).

    Privacy:
      (plan.keyword_epsilon, plan.keyword_delta)-DP for one record, add/remove-one: the
      Gaussian partition selection with counts, L2 sensitivity sqrt(K) (Google PipelineDP;
      Wilkins et al. 2024).
    """
    return release_key_counts(
        keywords,
        epsilon=plan.keyword_epsilon,
        delta=plan.keyword_delta,
        max_keys=plan.config.max_keywords,
    )


def cooccurrence_counts(
    keywords: Sequence[Sequence[str]],
    memberships: Sequence[Sequence[int]],
    vocabulary: Sequence[str],
    num_clusters: int,
) -> np.ndarray:
    """[clusters, vocabulary] counts: records of each cluster holding each keyword.

    A record adds +1 to (c, w) for each cluster c it joined and each of its keywords w in the
    public `vocabulary`, except the cluster's own keyword (`vocabulary[c]`): at most
    L (K - 1) cells, each by 1.
    """
    column = {word: j for j, word in enumerate(vocabulary)}
    counts = np.zeros((num_clusters, len(vocabulary)), np.float64)
    for words, clusters in zip(keywords, memberships, strict=True):
        cols = [column[w] for w in dict.fromkeys(words) if w in column]
        for c in clusters:
            for j in cols:
                if j != c:
                    counts[c, j] += 1
    return counts


def release_cluster_keywords(
    keywords: Sequence[Sequence[str]],
    memberships: Sequence[Sequence[int]],
    vocabulary: Sequence[str],
    num_clusters: int,
    plan: KnowledgePlan,
    rng: np.random.Generator,
) -> list[list[str]]:
    """Stage 2: each cluster's keyword followed by its top co-keywords (noisy counts).

    Args:
      keywords: each record's keywords.
      memberships: each record's clusters (at most L), indices into `vocabulary`'s first
        `num_clusters` entries (a cluster is named by its keyword).
      vocabulary: the released keywords (public), clusters first.
      num_clusters: how many of them are clusters.
      plan: the release's plan (noise, threshold, how many to name).
      rng: the noise.

    Returns:
      For each cluster, its own keyword then at most ``config.cluster_keywords`` others by
      descending noisy count, each above ``plan.cluster_threshold``; and each cluster's
      strongest co-keyword's noisy count (0 when none clears the threshold).

    Privacy:
      The Gaussian mechanism, L2 sensitivity sqrt(L (K - 1)) (module docstring), multiplier
      ``plan.cluster_noise_multiplier``; what is named is post-processing.
    """
    limit = max(len(c) for c in memberships) if memberships else 0
    if limit > plan.config.clusters_per_record:
        raise ValueError(f"a record joins more than L clusters: {limit=}")
    counts = cooccurrence_counts(keywords, memberships, vocabulary, num_clusters)
    noisy = mechanisms.gaussian_mechanism(
        counts,
        sensitivity=plan.cluster_sensitivity,
        noise_multiplier=plan.cluster_noise_multiplier,
        rng=rng,
    )
    named, strongest = [], []
    for c in range(num_clusters):
        row = noisy[c].copy()
        row[c] = -np.inf  # the cluster's own keyword leads anyway
        order = [j for j in np.argsort(-row, kind="stable") if row[j] >= plan.cluster_threshold]
        top = order[: plan.config.cluster_keywords]
        named.append([vocabulary[c], *(vocabulary[j] for j in top)])
        strongest.append(float(row[order[0]]) if order else 0.0)
    return named, strongest
