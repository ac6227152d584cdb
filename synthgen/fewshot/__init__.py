"""DP few-shot generation (Tang et al. 2024): synthetic text from a frozen LM, no training.

Each synthetic example is generated token by token. For a token, the private examples of its
pool (its label's examples, or all) are Poisson-subsampled with rate q; every sampled example
joins one of M prompts uniformly at random (at most `max_shots` per prompt, the rest
dropped in random order). The M next-token distributions are averaged and one token is
released through `synthgen.privacy.mechanisms`:

  * ``gaussian``: N(0, (sigma * sqrt(2) / M)^2) noise on each candidate's mean probability,
    then argmax;
  * ``rnm``: the exponential mechanism (report-noisy-max with Gumbel noise) on the mean
    probabilities, `token_epsilon` per token.

Candidates are the whole vocabulary or, with `public_vocab=K` (RVP), the K most likely
tokens of the *public* prompt (the same prompt without private examples); `public_prior`
adds lambda * p_public to the noisy scores (post-processing of a public quantity). The
released token is appended to every prompt; generation stops at EOS, at a newline
(`stop_at_newline`) or at `max_new_tokens`.

`resample="token"` draws fresh examples for every token (Tang et al.'s analysis: every token
is amplified by subsampling; the prompts change, so each token is a full forward of the M
prompts). `resample="example"` draws once per synthetic example and decodes with the KV
cache (one cached step per token), at a higher privacy cost: its tokens share one draw.
Either way the public prompt is scored alone, in its own call.

Privacy:
  Unit: one private example; add/remove-one neighbours. Adding an example changes at most
  one of the M prompts of a token of its own pool, so the mean distribution moves by at
  most sqrt(2)/M in L2 (two distributions differ by at most sqrt(2)) and 1/M in L-infinity;
  every row is normalised to a probability distribution before the mean, whatever the
  backend returns. A token is a Gaussian mechanism of multiplier sigma (or a
  token_epsilon-DP exponential mechanism) on a Poisson subsample of rate q;
  `accounting.fewshot_event` composes them with the PLD accountant.
  Only declared public figures fix the guarantee: q = M * shots / public_pool_size for
  every pool, and each example of a pool joins the sample with probability exactly q, so
  a real pool larger than declared only means more expected examples (each prompt still
  keeps at most `max_shots`); a pool smaller than declared is refused before anything is
  charged, naming its (public) label but never its size. delta defaults to 1 / (10 N)
  with N = public_pool_size x pools, and must be below 1 / N. The charge covers the worst
  pool's token budget (examples of that pool x max_new_tokens), charged before the first
  token; stopping early at EOS only spends less. The public prompt is scored in calls
  whose inputs are all public (batched numerics would otherwise make it depend on the
  private rows); it, the candidate set and the stopping rule read only public text and
  released tokens.

Modules, one concept each:

  * `config`: `FewShotConfig`, the run's public hyper-parameters;
  * `plan`: the guarantee fixed before a run (`plan_privacy`, `plan_for`, `FewShotPlan`);
  * `sampling`: pools and their Poisson subsets (`draw_subsets`);
  * `prompts`: templates, targets and prompt token ids (`PromptTemplate`, `_Prompts`);
  * `mechanism`: the release of one token (`release_token`, RVP, the public prior);
  * `generation`: the generation loop (`generate`, `FewShotResult`);
  * `output`: the released folder and its metadata (`write_output`).

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
