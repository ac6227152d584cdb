"""`EvolutionPlan`: the guarantee of a Private Evolution run, fixed before it starts.

Privacy:
  Unit: one private sample; add/remove-one (`RELATION`). T iterations, each one DP
  nearest-neighbour histogram (`synthgen.privacy.nn_histogram`) of noise multiplier sigma
  (std sigma * sqrt(k), L2 sensitivity sqrt(k)), composed with the PLD accountant: the
  event is T self-compositions of Gaussian(sigma). Only public figures fix it: T, sigma or
  the target epsilon, k and delta (default 1 / (10 N), N declared). Nothing else of the
  run (prompts, lengths, number of samples) costs privacy: the LM never sees private text.
"""

from __future__ import annotations

import dataclasses

from synthgen.evolution.config import EvolutionConfig
from synthgen.fewshot.plan import resolve_delta
from synthgen.privacy import accounting
from synthgen.privacy.nn_histogram import RELATION, calibrate_nn_histogram, nn_histogram_event


@dataclasses.dataclass(frozen=True)
class EvolutionPlan:
    """T Gaussian histograms of multiplier sigma, and their (epsilon, delta)."""

    iterations: int
    noise_multiplier: float
    votes: int
    threshold_count: float
    public_size: int
    epsilon: float
    delta: float

    @property
    def relation(self) -> accounting.NeighboringRelation:
        """The neighbouring relation of `event` (`RELATION`, the one the ledger is charged
        under by `synthgen.evolution.generation`)."""
        return accounting.NeighboringRelation[RELATION]

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.votes**0.5

    @property
    def event(self):
        return nn_histogram_event(self.noise_multiplier, self.iterations)

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "noise_std": self.noise_std,
            "mechanism": "DP nearest-neighbour histogram (Gaussian), T compositions",
            "sensitivity_l2": self.votes**0.5,
            "unit": "one private sample",
            "neighboring_relation": RELATION,
            "accountant": "pld",
            "references": [
                "Lin et al. 2024, Private Evolution (ICLR 2024)",
                "Xie et al. 2024, Aug-PE (ICML 2024)",
            ],
        }


def plan_evolution(config: EvolutionConfig) -> EvolutionPlan:
    """Calibrates sigma from the target (or takes it) and states the guarantee.

    Raises:
      ValueError: a delta at or above 1 / N, or a target no noise reaches.
    """
    delta = resolve_delta(config.delta, config.public_size)
    sigma = config.noise_multiplier
    if sigma is None:
        sigma = calibrate_nn_histogram(config.target_epsilon, delta, config.iterations)
    eps = accounting.epsilon(nn_histogram_event(sigma, config.iterations), delta)
    std = sigma * config.votes**0.5
    return EvolutionPlan(
        iterations=config.iterations,
        noise_multiplier=float(sigma),
        votes=config.votes,
        threshold_count=float(config.threshold * std),
        public_size=config.public_size,
        epsilon=eps,
        delta=delta,
    )
