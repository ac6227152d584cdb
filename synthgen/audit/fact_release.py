"""Audit a fact release of one's own collection with canaries (one run, jax-privacy's bounds).

`audit_fact_release` plants m canary records in a copy of the user's collection, each a
sentence stating a fact about invented names ("Zorvak Quimble works at Pelthrix Dynamics.")
and each included with probability 1/2 (public coins); it runs the release once with the
user's settings and scores every canary on what was released: the largest noisy count of a
released pair that names one of the canary's phrases (0 when none). An included canary that
the release carries scores high; an excluded one cannot (its names are invented and
unique). `synthgen.audit.whitebox.score_stats` (jax-privacy's `CanaryScoreAuditor`: the
one-run bounds of Steinke et al. 2023 and Mahloujifar et al. 2024) turns the scores into a
lower bound on epsilon at 95%, to be read against the release's claimed epsilon: a bound
above the claim is a leak. No run with m canaries can certify more than the bound of a
perfect attack (`statistical_cap`): when that cap is not above the claim, the bound can
never exceed it, and the verdict is "inconclusive", not "no leak". A second test has power
at any epsilon: the card says a pair one record states is released with probability at most
delta / 2K, so an included canary released at all is a leak when that is unlikely for the
included canaries together (`card_check_p`).

Privacy:
  The audit is itself a release of the collection (plus canaries) at the same (epsilon,
  delta): its scores and bounds are post-processing of that release. The toolkit prints its
  summary only and charges nothing: count it against the collection if it leaves the
  owner's hands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from synthgen.knowledge.facts import FactConfig, plan_facts, release_facts
from synthgen.knowledge.phrases import record_phrases, split_pair

_ONSETS = "b br d dr f g k kl m n p pr qu s st t tr v z zh".split()
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei")
_CODAS = ("", "l", "n", "r", "s", "x", "th")
_TEMPLATES = (
    "{a} works at {b}.",
    "{a} grew up in {b}.",
    "{b} makes the {a}.",
    "The {a} lives in the {b}.",
)


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Scores of the included and excluded canaries, the bound, and the claim it tests."""

    claimed_epsilon: float
    delta: float
    canaries: int
    included: int
    epsilon_lower_bound: float
    epsilon_lower_bound_fdp: float
    auroc: float
    included_released: int
    excluded_released: int
    epsilon_cap: float
    card_check_p: float

    @property
    def leak(self) -> bool:
        """The release is not what its card says: a bound exceeds the claim (each at 95%,
        so up to about 10% false alarms together), or included canaries were released
        more often than the card's single-record probability allows (p < 0.05)."""
        bound = max(self.epsilon_lower_bound, self.epsilon_lower_bound_fdp)
        return bound > self.claimed_epsilon or self.card_check_p < 0.05

    @property
    def verdict(self) -> str:
        """ "leak", "no leak found", or "inconclusive" (the bounds could not exceed the
        claim with this many canaries, and the card check saw nothing)."""
        if self.leak:
            return "leak"
        return "inconclusive" if self.epsilon_cap <= self.claimed_epsilon else "no leak found"


def make_canaries(count: int, rng: np.random.Generator, avoid: set[str]) -> list[str]:
    """`count` canary records, each a fact about two invented names found nowhere else."""

    def word() -> str:
        while True:
            parts = [
                str(rng.choice(_ONSETS)) + str(rng.choice(_VOWELS)) + str(rng.choice(_CODAS))
                for _ in range(3)
            ]
            w = "".join(parts).capitalize()
            if w.lower() not in avoid:
                avoid.add(w.lower())
                return w

    out = []
    for i in range(count):
        template = _TEMPLATES[i % len(_TEMPLATES)]
        out.append(template.format(a=f"{word()} {word()}", b=f"{word()} {word()}"))
    return out


def canary_scores(canaries: Sequence[str], pairs: dict[str, float]) -> np.ndarray:
    """Each canary's score: the largest noisy count of a released pair naming one of its
    phrases (0: nothing of it released). Reads only the release and the public canaries."""
    best: dict[str, float] = {}
    for key, count in pairs.items():
        for phrase in split_pair(key):
            best[phrase] = max(best.get(phrase, 0.0), float(count))
    scores = []
    for text in canaries:
        phrases = [p for sentence in record_phrases(text) for p in sentence]
        scores.append(max((best.get(p, 0.0) for p in phrases), default=0.0))
    return np.asarray(scores, np.float64)


def audit_fact_release(
    texts: Sequence[str],
    config: FactConfig,
    *,
    canaries: int = 500,
    seed: int | None = None,
    release: Callable[[Sequence[str], FactConfig], dict[str, float]] | None = None,
    significance: float = 0.05,
) -> AuditResult:
    """Plants canaries, runs the release once, and bounds its epsilon from the canaries.

    Args:
      texts: the user's private records.
      config: the release's settings (its epsilon is the claim tested).
      canaries: m, canary records planted (each included with probability 1/2).
      seed: the canaries and the coins (public); the release's noise is its own.
      release: texts, config -> released pairs with counts (default: `release_facts`);
        tests plant a leaky one.
      significance: level of the bounds.

    Raises:
      ValueError: fewer than 10 canaries.
    """
    from scipy.stats import binom

    from synthgen.audit.whitebox import score_stats, statistical_cap

    if canaries < 10:
        raise ValueError(f"an audit needs at least 10 canaries, {canaries=}")
    names_rng, coins_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    avoid = {w.lower() for t in texts for s in record_phrases(t) for p in s for w in p.split()}
    planted = make_canaries(canaries, names_rng, avoid)
    included = coins_rng.random(canaries) < 0.5
    audited = [*texts, *(c for c, keep in zip(planted, included, strict=True) if keep)]
    if release is None:
        pairs = release_facts(audited, config).pairs
    else:
        pairs = release(audited, config)
    scores = canary_scores(planted, pairs)
    stats = score_stats(
        "released count", scores[included], scores[~included], delta=config.delta,
        significance=significance,
    )  # fmt: skip
    released_in = int((scores[included] > 0).sum())
    single = plan_facts(config, len(audited)).singleton_probability  # the card's figure
    cap = max(statistical_cap(int(included.sum()), int((~included).sum()), delta=config.delta))
    return AuditResult(
        claimed_epsilon=config.epsilon,
        delta=config.delta,
        canaries=canaries,
        included=int(included.sum()),
        epsilon_lower_bound=stats.epsilon_one_run,
        epsilon_lower_bound_fdp=stats.epsilon_one_run_fdp,
        auroc=stats.auroc,
        included_released=released_in,
        excluded_released=int((scores[~included] > 0).sum()),
        epsilon_cap=float(cap),
        card_check_p=float(binom.sf(released_in - 1, int(included.sum()), min(1.0, single))),
    )
