"""The release's plan: each stage's noise and the composed guarantee, from public figures.

Three DP stages read the private records (`synthgen.knowledge.release`):

1. keywords: PipelineDP's partition selection with counts (`synthgen.privacy.partition_selection`),
   (epsilon_1, delta_1)-DP, K keywords per record;
2. cluster keywords: the Gaussian mechanism on the (cluster, keyword) co-occurrence counts
   over the public domain released by stage 1; a record sits in at most L clusters and adds
   at most K - 1 keywords to each, so the L2 sensitivity is sqrt(L (K - 1));
3. generation: per cluster, R records, each F fields released once over the cluster's
   keywords (`synthgen.knowledge.fields`), or T tokens of free text (DP few-shot token
   aggregation, `synthgen.fewshot`); Poisson voters at rate q, a fresh draw per field or
   per free text, the Gaussian mechanism on the mean of M distributions; a record reaches
   at most L clusters, so its tokens are charged L times (no parallel composition: clusters
   overlap).

The stages' budgets are public shares of the target, scaled together (bisection) until the
composed epsilon (PLD, dp-accounting) meets it.

Privacy:
  Unit: one record of the collection; add/remove-one. Nothing here reads a record.
"""

from __future__ import annotations

import dataclasses
import math

from dp_accounting import dp_event

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.plan import RELATION, FewShotPlan, plan_privacy
from synthgen.knowledge.config import KnowledgeConfig
from synthgen.privacy import accounting

DELTA_PARTS = 3  # delta is split evenly between the three stages


@dataclasses.dataclass(frozen=True)
class KnowledgePlan:
    """Every stage's public parameters and the composed guarantee.

    Attributes:
      keyword_epsilon, keyword_delta: stage 1's (epsilon, delta) (PipelineDP).
      cluster_noise_multiplier: stage 2's sigma (std sigma * sqrt(L (K - 1)) per count).
      cluster_sensitivity: sqrt(L (K - 1)).
      cluster_threshold: a co-keyword is named only above this noisy count (public:
        3 noise stds).
      fewshot: stage 3's generation config, its noise fixed.
      generation: stage 3's plan.
      epsilon, delta: the whole release's guarantee (composed, PLD).
    """

    config: KnowledgeConfig
    keyword_epsilon: float
    keyword_delta: float
    cluster_noise_multiplier: float
    cluster_delta: float
    fewshot: FewShotConfig
    generation: FewShotPlan
    epsilon: float
    delta: float

    @property
    def cluster_sensitivity(self) -> float:
        c = self.config
        return math.sqrt(c.clusters_per_record * (c.max_keywords - 1))

    @property
    def cluster_noise_std(self) -> float:
        return self.cluster_noise_multiplier * self.cluster_sensitivity

    @property
    def cluster_threshold(self) -> float:
        return 3.0 * self.cluster_noise_std

    @property
    def keyword_event(self) -> dp_event.DpEvent:
        return accounting.epsilon_delta_event(self.keyword_epsilon, self.keyword_delta)

    @property
    def cluster_event(self) -> dp_event.DpEvent:
        return accounting.gaussian_event(self.cluster_noise_multiplier)

    @property
    def event(self) -> dp_event.DpEvent:
        """The whole release: the three stages composed (what the ledger is charged)."""
        return accounting.compose([self.keyword_event, self.cluster_event, self.generation.event])

    def stages(self) -> list[dict]:
        """Each stage's share of the guarantee, for the card (epsilon at its own delta).

        The stages' epsilons do not add up to the release's: each is stated at its own third
        of delta, and the release is their PLD composition at the whole delta (the card's
        total). ``note`` says so on every row, and the keyword stage states the probability
        that a keyword held by one record is released."""
        from synthgen.privacy.partition_selection import keep_probability

        cluster_eps = accounting.epsilon(self.cluster_event, self.cluster_delta)
        note = (
            f"this stage alone, at delta={self.keyword_delta:.3g}; the stages compose (PLD) "
            f"to the release's ({self.epsilon:.4g}, {self.delta:.3g}), not to their sum"
        )
        singleton = keep_probability(
            1, self.keyword_epsilon, self.keyword_delta, self.config.max_keywords
        )
        return [
            {
                "stage": "keywords",
                "epsilon": self.keyword_epsilon,
                "delta": self.keyword_delta,
                "singleton_release_probability": singleton,
                "note": note,
            },
            {
                "stage": "cluster-keywords",
                "epsilon": cluster_eps,
                "delta": self.cluster_delta,
                "note": note,
            },
            {
                "stage": "generation",
                "epsilon": self.generation.epsilon,
                "delta": self.generation.delta,
                "note": note,
            },
        ]

    def to_dict(self) -> dict:
        c = self.config
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "unit": "one record of the collection",
            "neighboring_relation": RELATION,
            "accountant": "pld",
            "max_keywords": c.max_keywords,
            "clusters_per_record": c.clusters_per_record,
            "stages": [
                {
                    "stage": "keywords",
                    "mechanism": "PipelineDP Gaussian partition selection with counts",
                    "l2_sensitivity": math.sqrt(c.max_keywords),
                    "epsilon": self.keyword_epsilon,
                    "delta": self.keyword_delta,
                },
                {
                    "stage": "cluster-keywords",
                    "mechanism": "Gaussian mechanism on (cluster, keyword) co-occurrence counts",
                    "l2_sensitivity": self.cluster_sensitivity,
                    "noise_multiplier": self.cluster_noise_multiplier,
                    "noise_std": self.cluster_noise_std,
                    "threshold": self.cluster_threshold,
                    "epsilon": accounting.epsilon(self.cluster_event, self.cluster_delta),
                    "delta": self.cluster_delta,
                },
                {"stage": "generation", **self.generation.to_dict()},
            ],
        }


def _gaussian_multiplier(epsilon: float, delta: float) -> float:
    """The least Gaussian noise multiplier that is (epsilon, delta)-DP (bisection, PLD)."""
    low, high = 0.05, 1.0
    while accounting.epsilon(accounting.gaussian_event(high), delta) > epsilon:
        low, high = high, high * 2
        if high > 1e6:
            raise ValueError(f"no Gaussian noise reaches {epsilon=} at {delta=}")
    while high - low > 1e-3 * high:
        mid = math.sqrt(low * high)
        ok = accounting.epsilon(accounting.gaussian_event(mid), delta) <= epsilon
        low, high = (low, mid) if ok else (mid, high)
    return high


def fewshot_config(config: KnowledgeConfig, epsilon: float, delta: float) -> FewShotConfig:
    """Stage 3's generation config at (epsilon, delta), noise not yet resolved."""
    return FewShotConfig(
        public_pool_size=config.public_pool_size,
        subsets=config.voters,
        shots=1,
        max_shots=1,
        shot_tokens=config.shot_tokens,
        max_new_tokens=config.tokens_per_draw,
        mechanism="gaussian",
        target_epsilon=epsilon,
        delta=delta,
        public_vocab=config.public_vocab,
        public_prior=config.public_prior,
        resample="example",
        stop_at_newline=True,
        allow_small_pools=True,
    )


def _plan_at(config: KnowledgeConfig, scale: float) -> KnowledgePlan:
    part = config.delta / DELTA_PARTS
    e1 = scale * config.keyword_share * config.epsilon
    e2 = scale * config.cluster_keyword_share * config.epsilon
    e3 = scale * (1 - config.keyword_share - config.cluster_keyword_share) * config.epsilon
    sigma = _gaussian_multiplier(e2, part)
    fewshot = fewshot_config(config, e3, part)
    tokens = config.records_per_cluster * config.draws_per_record * config.tokens_per_draw
    generation = plan_privacy(fewshot, tokens, config.max_clusters, config.clusters_per_record)
    fewshot = dataclasses.replace(
        fewshot, target_epsilon=None, noise_multiplier=generation.noise_multiplier
    )
    plan = KnowledgePlan(config, e1, part, sigma, part, fewshot, generation, math.inf, config.delta)
    eps = accounting.epsilon(plan.event, config.delta)
    return dataclasses.replace(plan, epsilon=eps)


def plan_release(config: KnowledgeConfig, *, iterations: int = 5) -> KnowledgePlan:
    """The plan whose composed epsilon is the largest not above ``config.epsilon``.

    Each stage starts at its share of epsilon (their plain sum is the target); PLD
    composes the Gaussian parts for less than the sum, so the shares are scaled up together
    by bisection while the composition stays within the target.

    Raises:
      ValueError: the target cannot be met (e.g. delta too small for the stages).
    """
    best = _plan_at(config, 1.0)
    if best.epsilon > config.epsilon * (1 + 1e-9):
        raise ValueError(f"the stages compose to {best.epsilon:.4g} > {config.epsilon=}")
    low, high = 1.0, 1.0 / (config.keyword_share + config.cluster_keyword_share) + 1.0
    high = min(high, 3.0)
    for _ in range(iterations):
        mid = (low + high) / 2
        plan = _plan_at(config, mid)
        if plan.epsilon <= config.epsilon:
            low, best = mid, plan
        else:
            high = mid
    return best
