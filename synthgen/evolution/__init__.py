"""Private Evolution for text (Lin et al. 2024; Aug-PE, Xie et al. 2024): DP synthetic text
whose privacy cost does not grow with its length or number.

The LM sees public prompts only; each of T iterations lets every private sample vote for
its nearest synthetic samples (`synthgen.privacy.nn_histogram`), and the LM writes
variations of the samples drawn by the noisy votes. See docs/guides/evolution.md.

Privacy:
  Unit: one private sample; add/remove-one. T Gaussian histograms of L2 sensitivity
  sqrt(k), composed under PLD; delta defaults to 1 / (10 N), N declared. Checked against
  the ledger before any work, charged before the first histogram.

References: Lin, Gopi, Kulkarni, Nori, Yekhanin 2024, "Differentially Private Synthetic
Data via Foundation Model APIs 1: Images" (ICLR 2024); Xie, Lin, Yekhanin, Gopi,
Kulkarni, et al. 2024, "Differentially Private Synthetic Data via Foundation Model APIs 2:
Text" (ICML 2024).
"""

from synthgen.evolution.config import (
    DEFAULT_INITIAL_PROMPT,
    DEFAULT_VARIATION_PROMPT,
    EvolutionConfig,
)
from synthgen.evolution.generation import EvolutionResult, evolve, initial_prompts
from synthgen.evolution.output import write_output
from synthgen.evolution.plan import EvolutionPlan, plan_evolution
from synthgen.evolution.sampler import FlaxSampler, NextTokenSampler, TextSampler, make_sampler

__all__ = [
    "DEFAULT_INITIAL_PROMPT",
    "DEFAULT_VARIATION_PROMPT",
    "EvolutionConfig",
    "EvolutionPlan",
    "EvolutionResult",
    "FlaxSampler",
    "NextTokenSampler",
    "TextSampler",
    "evolve",
    "initial_prompts",
    "make_sampler",
    "plan_evolution",
    "write_output",
]
