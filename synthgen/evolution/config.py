"""`EvolutionConfig`: the public hyper-parameters of a Private Evolution run."""

from __future__ import annotations

import dataclasses
import math

DEFAULT_INITIAL_PROMPT = "Write one paragraph of an encyclopedia article about {label}."
DEFAULT_VARIATION_PROMPT = (
    "Rewrite this encyclopedia paragraph about {label} in your own words, keeping its "
    "subject:\n\n{text}"
)


@dataclasses.dataclass(frozen=True)
class EvolutionConfig:
    """Public parameters of a run; every field is public and fixes the guarantee.

    Attributes:
      num_samples: synthetic samples released (split evenly over `labels`, round robin).
      iterations: T, DP nearest-neighbour histograms (one per iteration).
      target_epsilon: the run's epsilon (sigma calibrated from it), or `noise_multiplier`.
      noise_multiplier: sigma of every histogram (noise std sigma * sqrt(votes)).
      delta: the run's delta; default 1 / (10 N) with N = `public_size`.
      public_size: N, the private data's declared (public) size: delta < 1 / N; a run
        over more private samples than N is refused (without printing their count).
      labels: the public label list ("" = one unlabelled pool).
      votes: k, nearest synthetic samples each private sample votes for (L2 sensitivity
        sqrt(k)).
      threshold: noisy counts below `threshold` x the noise std count as 0.
      population: synthetic samples per label in each iteration (default: the label's
        share of `num_samples`).
      keep_share: share of the next population taken by the best distinct selected
        samples themselves (the rest are LM variations of the selected ones).
      initial_prompt: public prompt of the first population; may use {label}.
      variation_prompt: public prompt of a variation; uses {text} (a selected synthetic
        sample, never a private one) and may use {label}.
      max_new_tokens: most tokens of a generated sample.
      temperature: sampling temperature of the LM.
      top_p: nucleus cut of the LM's sampling.
      batch_size: prompts per batched generation call (a power of two: the local decoder
        pads a batch's rows up to one).
    """

    num_samples: int
    iterations: int = 4
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float | None = None
    public_size: int = 1000
    labels: tuple[str, ...] = ("",)
    votes: int = 1
    threshold: float = 2.0
    population: int | None = None
    keep_share: float = 0.25
    initial_prompt: str = DEFAULT_INITIAL_PROMPT
    variation_prompt: str = DEFAULT_VARIATION_PROMPT
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 0.95
    batch_size: int = 32

    def __post_init__(self) -> None:
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError(
                f"give exactly one of target_epsilon and noise_multiplier: "
                f"{self.target_epsilon=} {self.noise_multiplier=}"
            )
        for name in ("target_epsilon", "noise_multiplier"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value=}")
        for name in ("num_samples", "iterations", "public_size", "votes", "max_new_tokens",
                     "batch_size"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)=}")
        if not self.labels or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be a non-empty list of distinct labels: {self.labels=}")
        if self.num_samples < len(self.labels):
            raise ValueError(f"need num_samples >= labels: {self.num_samples=} {self.labels=}")
        if self.population is not None and self.population < 1:
            raise ValueError(f"population must be >= 1, got {self.population=}")
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be finite and >= 0, got {self.threshold=}")
        if not 0 <= self.keep_share < 1:
            raise ValueError(f"keep_share must be in [0, 1), got {self.keep_share=}")
        if "{text}" not in self.variation_prompt:
            raise ValueError("variation_prompt must contain {text}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature >= 0, 0 < top_p <= 1: {self.temperature=}")

    def samples_per_label(self) -> list[int]:
        """Released samples of each label: `num_samples` split round robin."""
        base, extra = divmod(self.num_samples, len(self.labels))
        return [base + (i < extra) for i in range(len(self.labels))]

    def population_per_label(self) -> list[int]:
        """Candidates of each label in every iteration (at least its released samples)."""
        if self.population is None:
            return self.samples_per_label()
        return [max(self.population, n) for n in self.samples_per_label()]
