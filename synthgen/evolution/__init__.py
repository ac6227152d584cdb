"""Private Evolution for text (Lin et al. 2024; Aug-PE, Xie et al. 2024): DP synthetic text
whose privacy cost does not grow with its length or number.

The LM never sees private data. A population of synthetic samples is generated from public
prompts (per public label); each of T iterations embeds it, lets every private sample vote
for its nearest synthetic samples (a DP nearest-neighbour histogram: Gaussian noise,
public threshold), draws samples in proportion to the noisy votes and asks the LM for
variations of the drawn (synthetic) samples. The last draw is released.

Privacy:
  Unit: one private sample; add/remove-one. Each iteration is one Gaussian mechanism of
  L2 sensitivity sqrt(k) (k votes of weight 1, within the sample's own label);
  T iterations compose to T Gaussians of multiplier sigma under the PLD accountant,
  sigma calibrated from the target (epsilon, delta); delta defaults to 1 / (10 N) with N
  declared. The run is checked against the ledger before any work and charged before the
  first histogram. Everything else (prompts, number and length of samples, the LM and its
  sampling) is public and free.

Modules, one concept each:

  * `config`: `EvolutionConfig`, the public parameters;
  * `plan`: `plan_evolution`, `EvolutionPlan` (the guarantee fixed before a run);
  * `sampler`: batched text sampling from public prompts (`make_sampler`);
  * `generation`: the loop (`evolve`, `EvolutionResult`);
  * `output`: the released folder (`write_output`).

The histogram mechanism itself lives in `synthgen.privacy.nn_histogram`.

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
