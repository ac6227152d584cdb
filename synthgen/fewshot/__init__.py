"""DP few-shot generation (Tang et al. 2024): synthetic text from a frozen LM, no training.

Each token is released by privately aggregating the next-token distributions of M prompts:
the private examples of its pool are Poisson-subsampled once (rate q) and every sampled
example joins one of the M prompts at random (`gaussian` noise then argmax, or the `rnm`
exponential mechanism; RVP and a public prior optional). See docs/guides/fewshot.md for the
algorithm, the two samplings and the full argument.

Privacy:
  Unit: one private example; add/remove-one neighbours. An example changes at most one of
  the M prompts of a token, so the mean of the (normalised) distributions moves by at most
  sqrt(2)/M in L2 and 1/M in L-infinity; each token is a Poisson-subsampled Gaussian (or
  token_epsilon exponential) mechanism, composed with the PLD accountant. Only declared
  public figures fix the guarantee (q = M * shots / public_pool_size, delta < 1 / N); the
  worst pool's token budget is charged before the first token.

References: Tang, Shin, Inan, Manoel, Mireshghallah, Lin, Gopi, Kulkarni, Sim 2024,
"Privacy-Preserving In-Context Learning with Differentially Private Few-Shot Generation"
(ICLR 2024).
"""

from synthgen.fewshot.config import FewShotConfig, Mechanism, Resample
from synthgen.fewshot.generation import FewShotResult, generate
from synthgen.fewshot.mechanism import (
    distributions,
    private_mean,
    public_candidates,
    release_token,
)
from synthgen.fewshot.output import SEEDED_NOTE, write_output
from synthgen.fewshot.plan import (
    DELTA_SAFETY,
    RELATION,
    FewShotPlan,
    plan_for,
    plan_privacy,
    resolve_delta,
)
from synthgen.fewshot.prompts import (
    DOCUMENT_TEMPLATE,
    QUERY_TEMPLATE,
    PromptTemplate,
    round_robin_targets,
)
from synthgen.fewshot.sampling import draw_subsets

__all__ = [
    "DELTA_SAFETY",
    "DOCUMENT_TEMPLATE",
    "QUERY_TEMPLATE",
    "RELATION",
    "SEEDED_NOTE",
    "FewShotConfig",
    "FewShotPlan",
    "FewShotResult",
    "Mechanism",
    "PromptTemplate",
    "Resample",
    "distributions",
    "draw_subsets",
    "generate",
    "plan_for",
    "plan_privacy",
    "private_mean",
    "public_candidates",
    "release_token",
    "resolve_delta",
    "round_robin_targets",
    "write_output",
]
