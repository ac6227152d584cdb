"""Soft clusters: each record joins at most L clusters named by released keywords.

Every released keyword (public after stage 1) names a candidate cluster. A record may join
the clusters whose keyword it holds; when it holds more than L of them it keeps the L its
public-encoder embedding is closest to (cosine with the keyword's embedding; ties: the
higher-ranked cluster) when an encoder is given, else the L of highest noisy count, or of
lowest (``specific_first``: a record's rarest keywords name its topic; a first name every
topic's records share does not). A record that holds no cluster's keyword joins none.
Overlapping (soft) clusters keep a record's facts in every topic it belongs to; DP-SynRAG
measures hard clusters 16-32 points worse.

Privacy:
  A record's clusters are a function of that record and public inputs (the released
  keywords, a public encoder that was not trained on the collection): removing a record
  changes no other record's clusters, and it reaches at most L clusters, the bound the
  generation's accounting charges (`synthgen.knowledge.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def assign_clusters(
    keywords: Sequence[Sequence[str]],
    centres: Sequence[str],
    max_clusters_per_record: int,
    *,
    record_vectors: np.ndarray | None = None,
    centre_vectors: np.ndarray | None = None,
    specific_first: bool = False,
) -> list[list[int]]:
    """Each record's clusters (indices into `centres`), at most `max_clusters_per_record`.

    Args:
      keywords: each record's keywords (`synthgen.knowledge.keywords.record_keywords`).
      centres: the clusters' keywords, in rank order (public).
      max_clusters_per_record: L.
      record_vectors: [records, d] public-encoder embeddings of the records (optional).
      centre_vectors: [clusters, d] embeddings of the centres' keywords (with the above).
      specific_first: without vectors, keep the L clusters of lowest rank (the rarest
        keywords a record holds: its topic's own words, not a name every topic shares).

    Returns:
      One list of cluster indices per record, best first.
    """
    if max_clusters_per_record < 1:
        raise ValueError(f"max_clusters_per_record must be >= 1, {max_clusters_per_record=}")
    if (record_vectors is None) != (centre_vectors is None):
        raise ValueError("give both record_vectors and centre_vectors, or neither")
    rank = {word: i for i, word in enumerate(centres)}
    if record_vectors is not None:
        r = _unit(np.asarray(record_vectors, np.float64))
        c = _unit(np.asarray(centre_vectors, np.float64))
        if r.shape[0] != len(keywords) or c.shape[0] != len(centres):
            raise ValueError("one vector per record and per centre is needed")
    out = []
    for i, words in enumerate(keywords):
        held = sorted({rank[w] for w in words if w in rank}, reverse=specific_first)
        if record_vectors is not None and len(held) > max_clusters_per_record:
            sims = c[held] @ r[i]
            held = [held[j] for j in np.lexsort((held, -sims))]
        out.append(held[:max_clusters_per_record])
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)
