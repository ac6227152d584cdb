"""Public parameters of a one-time DP knowledge release (`KnowledgeConfig`).

Everything here is public: budget shares, the keyword and cluster bounds (K, L), the
generation's shape. The config fixes every sensitivity and every charge before a private
record is read (`synthgen.knowledge.plan`).
"""

from __future__ import annotations

import dataclasses
import math

# A public demonstration in the public prompt: without it the public LM's candidates after
# a bare "Record:" are code and digits, and the private votes have nothing readable to
# choose from. Generic on purpose (no domain's vocabulary); a user sets their own
# (`retriever knowledge release --mode clusters --example FILE`).
DEFAULT_PUBLIC_EXAMPLE = (
    "The Eiffel Tower, built in 1889 by Gustave Eiffel's company, stands in Paris "
    "and is 330 metres tall."
)
# The medical worked example, for the project's own medical world (`retriever.rag.medical`).
MEDICAL_PUBLIC_EXAMPLE = (
    "A 40-year-old patient, Anna Berg, came in with fever and a dry cough. "
    "The diagnosis was influenza, treated with rest and fluids."
)
# Fields a synthetic record of the medical world states, and how many keywords each names.
# Each field is one DP release over the cluster's keywords whose voters read one record each
# (`synthgen.knowledge.fields`): free text at the same budget is token salad with
# SmolLM2-135M on that world. No default: free text unless a user names fields.
MEDICAL_FIELDS = ("Diagnosis", "Symptoms", "Treatment")
MEDICAL_FIELD_VALUES = (1, 2, 1)
# Public worked examples that can precede each voter's record: (record, each field's value).
# Off by default, as measured: with SmolLM2-135M a single voter's top candidate is right for
# 65% / 8% / 55% of records (Diagnosis / Symptoms / Treatment) after a bare "Record:
# ...\n<Field>:" and 98% / 55% / 98% after these two, when the candidates are the record's
# disease, symptoms and treatment (40 records of the DP-RAG world); but in a real release,
# whose clusters also offer first names and symptom nouns, the examples made the votes name
# a first name or a noun ("Diagnosis: Amina"): 14 of 40 records named a disease against 18
# of 37 without, and the top BM25 record named the asked disease for 0.18 of the stream's
# questions against 0.43 (one release each at epsilon 10).
MEDICAL_FIELD_EXAMPLES = (
    (
        "Jane Doe, 52, came in with a dry cough and a high fever. Diagnosis: influenza. "
        "Treated with oseltamivir.",
        ("Influenza", "Dry cough, High fever", "Oseltamivir"),
    ),
    (
        "Mark Lee (31) reported itchy eyes, runny nose and sneezing and was diagnosed with "
        "hay fever; cetirizine was prescribed.",
        ("Hay fever", "Itchy eyes, Runny nose", "Cetirizine"),
    ),
)


@dataclasses.dataclass(frozen=True)
class KnowledgeConfig:
    """Public parameters of a knowledge release (DP-SynRAG, Mori et al. 2025).

    Attributes:
      epsilon: target epsilon of the whole release, per record (all stages composed).
      delta: delta of the whole release; a third to each stage.
      keyword_share: share of the budget for the keyword histogram (stage 1).
      cluster_keyword_share: share for the per-cluster keyword histogram (stage 2).
        The rest goes to generation; the shares are scaled together (bisection) so the
        composed epsilon meets `epsilon`.
      max_keywords: K, most keywords one record contributes (L2 sensitivity sqrt(K)).
      clusters_per_record: L, most clusters one record joins.
      max_clusters: most clusters generated for: released keywords in order of noisy count,
        skipping one that a kept cluster already names (`release.distinct_clusters`).
      cluster_keywords: most co-occurring keywords named per cluster.
      records_per_cluster: synthetic records generated per cluster.
      voters: M, prompts per token (each a private record of the cluster, or none).
      public_pool_size: declared pool size; each record joins a draw with probability
        q = voters / public_pool_size.
      max_new_tokens: T, token limit of a free-text record (``fields=()``).
      public_vocab: RVP's K candidates from the public prompt (the cluster's keyword
        tokens are added: public after stage 1).
      public_prior: weight of the public distribution added to the noisy votes.
      shot_tokens: a private record is cut to this many tokens in a prompt.
      public_example: free text: a public demonstration record in every prompt.
      fields: the facts a synthetic record states ("Diagnosis: ...", one DP release over
        the cluster's keywords each, `synthgen.knowledge.fields`); () (the default) for
        free text, generated token by token.
      field_values: how many keywords each field names.
      field_examples: public worked examples in every field vote's prompt: (record, one
        value per field); () for none.
      min_keyword_tokens: a word the LM writes in fewer tokens is not a keyword (1: any
        word; 2: common one-token words such as "swelling" are left out).
      specific_first: a record joins the clusters of its rarest released keywords
        (`synthgen.knowledge.clusters`) rather than its most frequent.
      min_cohesion: a cluster is generated for only if its most frequent co-keyword's
        noisy count is at least this share of its own (public: released counts); a
        keyword shared by every topic (a first name) names no topic.
      min_text_logprob: free text's self-filter: a generated text whose mean
        log-probability per token under the public LM (after the record's keywords) is
        below this is dropped (its keywords stay).
    """

    epsilon: float
    delta: float
    keyword_share: float = 0.2
    cluster_keyword_share: float = 0.2
    max_keywords: int = 6
    clusters_per_record: int = 2
    max_clusters: int = 64
    cluster_keywords: int = 5
    records_per_cluster: int = 1
    voters: int = 64
    public_pool_size: int = 128
    max_new_tokens: int = 32
    public_vocab: int = 5
    public_prior: float = 0.0
    shot_tokens: int = 96
    public_example: str = DEFAULT_PUBLIC_EXAMPLE
    fields: tuple[str, ...] = ()
    field_values: tuple[int, ...] = ()
    field_examples: tuple[tuple[str, tuple[str, ...]], ...] = ()
    min_keyword_tokens: int = 1
    specific_first: bool = True
    min_cohesion: float = 0.5
    min_text_logprob: float = -3.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, {self.epsilon=}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), {self.delta=}")
        shares = (self.keyword_share, self.cluster_keyword_share)
        if min(shares) <= 0 or sum(shares) >= 1:
            raise ValueError(f"shares must be > 0 and leave some for generation: {shares=}")
        for name in (
            "max_keywords",
            "clusters_per_record",
            "max_clusters",
            "cluster_keywords",
            "records_per_cluster",
            "voters",
            "max_new_tokens",
            "public_vocab",
            "shot_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, {name}={getattr(self, name)}")
        if self.max_keywords < 2:
            raise ValueError(f"max_keywords must be >= 2 (a cluster names co-keywords), {self=}")
        if self.clusters_per_record > self.max_keywords:
            raise ValueError(f"clusters_per_record must be <= max_keywords, {self=}")
        if self.public_pool_size < self.voters:
            raise ValueError(f"public_pool_size must be >= voters (q <= 1), {self=}")
        if len(self.fields) != len(self.field_values) or not all(
            f.strip() and "\n" not in f for f in self.fields
        ):
            raise ValueError(f"one count per field, fields one line each: {self.fields=}")
        if any(len(values) != len(self.fields) for _, values in self.field_examples):
            raise ValueError(
                "each field example needs one value per field (or set field_examples=()): "
                f"{self.fields=}"
            )
        if any(v < 1 for v in self.field_values):
            raise ValueError(f"field_values must be >= 1, {self.field_values=}")
        if self.public_prior < 0 or not math.isfinite(self.min_text_logprob):
            raise ValueError(f"need public_prior >= 0 and a finite min_text_logprob, {self=}")

    @property
    def draws_per_record(self) -> int:
        """Voter draws per synthetic record: one per field (one for free text)."""
        return max(1, len(self.fields))

    @property
    def tokens_per_draw(self) -> int:
        """Releases per draw: one per field; T tokens of free text."""
        return 1 if self.fields else self.max_new_tokens

    @property
    def sampling_rate(self) -> float:
        """q: each record's chance to be drawn into one voter's prompt of a cluster."""
        return self.voters / self.public_pool_size
