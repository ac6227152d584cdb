"""Audit a fact release of one's own collection with canaries (one run, jax-privacy's bounds).

`audit_fact_release` plants m canary records in a copy of the user's collection, each a fact
about invented names ("Zorvak Quimble works at Pelthrix Dynamics.") included with
probability 1/2 (public coins), runs the release once with the user's settings, and scores
every canary by the largest noisy count of a released pair naming one of its phrases (0
when none). `whitebox.score_stats` turns the scores into one-run lower bounds on epsilon at
95% (epsilon-count and f-DP), read against the release's claim and the cap of a perfect
attack (`statistical_cap`: a claim above it is "inconclusive", not "no leak"). Two further
tests have power at any epsilon: the card's single-record release probability
(`card_check_p`, which repeated canaries probe) and the K cap (over-K canaries, whose shared
pair a release that keeps to K never releases). The canary kinds, the verdicts and what
the canaries miss: docs/guides/audits.md ("Your own knowledge release").

Privacy:
  The audit is itself a release of the collection (plus canaries) at the same (epsilon,
  delta): its scores and bounds are post-processing of that release. Given a payer (the
  command line's), the release is charged once to it before any noise; without one (an
  evaluation on a synthetic world) nothing is charged.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence

import numpy as np

from synthgen.knowledge.facts import FactConfig, plan_facts, release_facts
from synthgen.knowledge.phrases import record_phrases, split_pair
from synthgen.privacy.receipts import Payer

_ONSETS = "b br d dr f g k kl m n p pr qu s st t tr v z zh".split()
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei")
_CODAS = ("", "l", "n", "r", "s", "x", "th")
_TEMPLATES = (
    "{a} works at {b}.",
    "{a} grew up in {b}.",
    "{b} makes the {a}.",
    "The {a} lives in the {b}.",
)
MAX_REPEATS = 200  # most statements of a repeated canary's pair, and records of a group
OVER_K_GROUPS = 3  # groups of over-K canaries: each missed with probability 0.01 at most


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Scores of the included and excluded canaries, the bounds, and the claim they test.

    ``epsilon_cap`` is the larger of the two caps (the f-DP one), ``epsilon_cap_count`` the
    epsilon-count bound's. ``repeats``: statements of the pair in every other canary, and
    records in each over-K group; ``repeated_released``: included repeated canaries
    released; ``beyond_k_released``: released pairs naming a name that over-K canaries
    state only past their K-th pair (0 for a release that keeps to K).
    """

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
    epsilon_cap_count: float
    repeats: int
    repeated_released: int
    over_k_records: int
    beyond_k_released: int

    @property
    def leak(self) -> bool:
        """The release is not what its card says: a bound exceeds the claim (each at 95%,
        so up to about 10% false alarms together), included canaries were released more
        often than the card's single-record probability allows (p < 0.05), or a pair no
        record contributes within its K was released (certain)."""
        bound = max(self.epsilon_lower_bound, self.epsilon_lower_bound_fdp)
        return (
            bound > self.claimed_epsilon or self.card_check_p < 0.05 or self.beyond_k_released > 0
        )

    @property
    def verdict(self) -> str:
        """ "leak", "no leak found" or "inconclusive" (the bounds could not exceed the claim
        with this many canaries, and the card checks saw nothing); a verdict that rests on
        the f-DP bound alone says so, and that it tests a stronger claim than the card's."""
        claim = self.claimed_epsilon
        fdp_only = (
            "by the f-DP bound alone, which tests a Gaussian mechanism's trade-off curve at "
            "this (epsilon, delta): a stronger claim than the card's (epsilon, delta)-DP"
        )
        if self.card_check_p < 0.05 or self.beyond_k_released or self.epsilon_lower_bound > claim:
            return "leak"
        if self.epsilon_lower_bound_fdp > claim:
            return f"leak ({fdp_only}; the card's own claim is not shown broken)"
        if self.epsilon_cap <= claim:
            return "inconclusive"
        if self.epsilon_cap_count <= claim:
            return (
                f"no leak found ({fdp_only}; the epsilon-count bound, which tests the card's "
                f"claim, cannot exceed {claim:g} with {self.canaries} canaries: its cap is "
                f"{self.epsilon_cap_count:.3g})"
            )
        return "no leak found"


def _namer(rng: np.random.Generator, avoid: set[str]) -> Callable[[], str]:
    """Invented two-word names, none in `avoid` (each one added to it)."""

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

    return lambda: f"{word()} {word()}"


def make_canaries(
    count: int, rng: np.random.Generator, avoid: set[str], repeats: int = 1
) -> list[str]:
    """`count` canary records, each a fact about two invented names found nowhere else;
    every other one (odd positions) states its fact `repeats` times."""
    name = _namer(rng, avoid)
    out = []
    for i in range(count):
        sentence = _TEMPLATES[i % len(_TEMPLATES)].format(a=name(), b=name())
        out.append(" ".join([sentence] * (repeats if i % 2 else 1)))
    return out


def make_over_k_canaries(
    groups: int, size: int, max_pairs: int, rng: np.random.Generator, avoid: set[str]
) -> tuple[list[str], set[str]]:
    """`groups` x `size` records, each stating `max_pairs` pairs of its own invented names,
    then its group's shared pair (past its K-th pair: `record_pairs` takes a sentence's
    pairs before the next sentence's). Returns the records and the shared names."""
    name = _namer(rng, avoid)
    records, shared = [], set()
    for _ in range(groups):
        a, b = name(), name()
        shared |= {a, b}
        for _ in range(size):
            own = [name() for _ in range(max_pairs + 1)]  # K + 1 names: K adjacent pairs
            met = own[1] if len(own) == 2 else f"{', '.join(own[1:-1])} and {own[-1]}"
            # the filler keeps the list of own names from stating a fact with the shared
            # name (`record_facts` pairs a list with the next statement's first name)
            records.append(f"{own[0]} met {met}. The day was mild. {a} grew up in {b}.")
    return records, shared


def canary_scores(canaries: Sequence[str], pairs: dict[str, float]) -> np.ndarray:
    """Each canary's score: the largest noisy count of a released pair naming one of its
    phrases (0: nothing of it released). Reads only the release and the public canaries."""
    best: dict[str, float] = {}
    for key, count in pairs.items():
        for phrase in split_pair(key):  # a typed key is "subject | value": the same split
            best[phrase.lower()] = max(best.get(phrase.lower(), 0.0), float(count))
    scores = []
    for text in canaries:
        phrases = [p.lower() for sentence in record_phrases(text) for p in sentence]
        scores.append(max((best.get(p, 0.0) for p in phrases), default=0.0))
    return np.asarray(scores, np.float64)


@dataclasses.dataclass(frozen=True)
class PlantedCollection:
    """The collection an audit releases: the user's records with its canaries planted.

    `audited` holds the user's records (private); the rest is public (invented names and
    coin flips drawn from the public seed).
    """

    audited: list[str] = dataclasses.field(repr=False)
    planted: list[str]
    included: np.ndarray
    over_k: list[str]
    shared: list[str]
    repeats: int

    def problems(self, config: FactConfig) -> list[str]:
        """Why the real release of this collection should not run (`FactPlan.problems`;
        `release_facts` refuses it): for a caller that charges, before the ledger."""
        return plan_facts(config, len(self.audited)).problems()


def plant(
    texts: Sequence[str], config: FactConfig, *, canaries: int = 500, seed: int | None = None
) -> PlantedCollection:
    """Plants the canaries (module docstring): m coin-flipped ones, every other one stating
    its pair `repeats` times, and ``OVER_K_GROUPS * repeats`` over-K ones, always.

    Raises:
      ValueError: fewer than 10 canaries.
    """
    if canaries < 10:
        raise ValueError(f"an audit needs at least 10 canaries, {canaries=}")
    names_rng, coins_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    avoid = {w.lower() for t in texts for s in record_phrases(t) for p in s for w in p.split()}
    plan = plan_facts(config, len(texts))  # public: records_needed reads epsilon, delta, K
    repeats = min(plan.records_needed(0.99), MAX_REPEATS)
    planted = make_canaries(canaries, names_rng, avoid, repeats=repeats)
    included = coins_rng.random(canaries) < 0.5
    over_k, shared = make_over_k_canaries(
        OVER_K_GROUPS, repeats, config.max_pairs, names_rng, avoid
    )
    audited = [*texts, *(c for c, keep in zip(planted, included, strict=True) if keep), *over_k]
    return PlantedCollection(audited, planted, included, over_k, list(shared), repeats)


def audit_fact_release(
    texts: Sequence[str],
    config: FactConfig,
    *,
    canaries: int = 500,
    seed: int | None = None,
    release: Callable[[Sequence[str], FactConfig], dict[str, float]] | None = None,
    significance: float = 0.05,
) -> AuditResult:
    """Plants canaries, runs the release once (uncharged), and bounds its epsilon from the
    canaries: `audit_planted` of `plant` (the command line charges the release instead).

    Args:
      texts: the user's private records.
      config: the release's settings (its epsilon is the claim tested).
      canaries: m, canary records planted (each included with probability 1/2).
      seed: the canaries and the coins (public); the release's noise is its own.
      release: texts, config -> released pairs with counts (default: `release_facts`);
        tests plant a leaky one.
      significance: level of the bounds.

    Raises:
      ValueError: see `plant`.
    """
    planted = plant(texts, config, canaries=canaries, seed=seed)
    return audit_planted(planted, config, release=release, significance=significance)


def audit_planted(
    collection: PlantedCollection,
    config: FactConfig,
    *,
    release: Callable[[Sequence[str], FactConfig], dict[str, float]] | None = None,
    pay: Payer | None = None,
    significance: float = 0.05,
) -> AuditResult:
    """Runs the release of the planted collection once and bounds its epsilon.

    Args:
      collection: from `plant`.
      config: the release's settings (its epsilon is the claim tested).
      release: as `audit_fact_release`'s (never charged: not with `pay`).
      pay: the payer charged the release once, before its noise (`release_facts`, through
        a private work folder removed after); None: nothing charged.
      significance: level of the bounds.

    Raises:
      ValueError: both `release` and `pay`.
      synthgen.privacy.BudgetExceededError: the payer cannot pay (nothing is drawn).
    """
    from scipy.stats import binom

    from synthgen.audit.whitebox import score_stats, statistical_cap

    if release is not None and pay is not None:
        raise ValueError("a planted release is never charged: pass release or pay, not both")
    c = collection
    audited, planted, included, over_k, shared = (
        c.audited, c.planted, c.included, c.over_k, c.shared
    )  # fmt: skip
    canaries, repeats = len(planted), c.repeats
    if release is not None:
        pairs = release(audited, config)
    elif pay is None:
        pairs = release_facts(audited, config).pairs
    else:  # the draw is kept in a private folder until the audit is done, then removed
        with tempfile.TemporaryDirectory(prefix="dpsynth-audit-") as work:
            pairs = release_facts(audited, config, work=work, pay=pay).pairs
    scores = canary_scores(planted, pairs)
    stats = score_stats(
        "released count", scores[included], scores[~included], delta=config.delta,
        significance=significance,
    )  # fmt: skip
    released_in = int((scores[included] > 0).sum())
    repeated = np.arange(canaries) % 2 == 1
    single = plan_facts(config, len(audited)).singleton_probability  # the card's figure
    cap_count, cap_fdp = statistical_cap(
        int(included.sum()), int((~included).sum()), delta=config.delta
    )
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
        epsilon_cap=float(max(cap_count, cap_fdp)),
        card_check_p=float(binom.sf(released_in - 1, int(included.sum()), min(1.0, single))),
        epsilon_cap_count=float(cap_count),
        repeats=repeats,
        repeated_released=int((scores[included & repeated] > 0).sum()),
        over_k_records=len(over_k),
        beyond_k_released=sum(
            any(p.lower() in {x.lower() for x in shared} for p in split_pair(k)) for k in pairs
        ),
    )
