"""The DP few-shot generation loop: one synthetic text per target, token by token.

Privacy:
  (plan.epsilon, plan.delta)-DP for one private example under add/remove-one, paid for
  before the first token (stopping early at EOS only spends less). The public prompt is
  scored in calls whose inputs are all public; the stopping rule reads only released
  tokens. See `synthgen.fewshot` (Tang et al. 2024).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.mechanism import release_token
from synthgen.fewshot.plan import FewShotPlan, _check_plan, plan_for
from synthgen.fewshot.prompts import PromptTemplate, _Prompts
from synthgen.fewshot.sampling import _pools, draw_subsets
from synthgen.next_token import NextTokenLM
from synthgen.privacy.receipts import Payer, Receipt, paid


@dataclasses.dataclass
class FewShotResult:
    """Texts (one per target), the plan, the released tokens and the charge's receipt (None:
    uncharged). No timings: how long private work took is not part of a release."""

    texts: list[str]
    plan: FewShotPlan
    tokens_released: int
    receipt: Receipt | None = None


def generate(
    lm: NextTokenLM,
    private_rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    config: FewShotConfig,
    *,
    pool_field: str | None = None,
    rng: np.random.Generator,
    pay: Payer | None = None,
    plan: FewShotPlan | None = None,
    on_token: Callable[[int, FewShotPlan], None] | None = None,
) -> FewShotResult:
    """Generates one synthetic text per target by DP few-shot aggregation.

    Args:
      lm: the frozen LM backend.
      private_rows: private examples (mappings with the fields `template.shot` reads).
      targets: one mapping per synthetic example with the fields header and stem read
        (e.g. {"label": ...} from a public label list, or a public document); public.
      template: prompt layout.
      config: hyper-parameters, with the declared `public_pool_size`.
      pool_field: if set, a target uses only the private rows whose `pool_field` equals
        its own (label-conditioned generation); else all rows. Rows whose value is no
        target's are never used.
      rng: host randomness (subsampling and noise); production: `secure_rng()`.
      pay: the caller's payer (`synthgen.privacy.receipts.ledger_payer`), called once
        with the plan before the first token; None: an uncharged run (tests, benchmarks
        that account for themselves).
      plan: a plan from `plan_for` (computed here if None).
      on_token: called after every released token with the total released so far.

    Returns:
      The texts (without the stop token), the plan and the receipt of its charge.

    Raises:
      ValueError: a pool smaller than `config.public_pool_size` (its label is named, its
        size never), a plan that does not cover the run, or prompts that may overflow the
        model's context; all before the charge.

    Privacy:
      (plan.epsilon, plan.delta)-DP for one private example under add/remove-one, paid for
      (`pay`) before any token is released (module docstring).
    """
    plan = plan or plan_for(private_rows, targets, template, config, pool_field=pool_field)
    pools = _pools(private_rows, targets, pool_field, config.min_pool_size)
    _check_plan(plan, config, pools)
    prompts = _Prompts(lm, template, private_rows, config.shot_tokens)
    frames = [prompts.frame(target) for target in targets]
    # A prompt's length depends on the private examples drawn: refuse, before the charge,
    # any run whose public worst case does not fit the model's context.
    context = getattr(lm, "max_context", None)
    worst = prompts.worst_length(frames, config.shots_cap)
    if context is not None and worst + config.max_new_tokens > context:
        raise ValueError(
            f"a prompt may reach {worst} + {config.max_new_tokens} new tokens, more than the "
            f"model's context {context}: lower shots, max_shots, shot_tokens or max_new_tokens"
        )
    prepare = getattr(lm, "prepare", None)
    if callable(prepare):  # a remote LM probes its server with a public prompt, pre-charge
        prepare()
    description = (
        f"DP few-shot generation: {len(targets)} examples, {plan.tokens} tokens per pool, "
        f"eps={plan.epsilon:.4g}"
    )
    receipt = paid(pay, plan, description)
    sample_rng, noise_rng = rng.spawn(2)
    released, texts = 0, []
    for frame, pool in zip(frames, pools, strict=True):
        public = prompts.prompt(frame, [])
        generated: list[int] = []
        if config.resample == "example":
            subsets = draw_subsets(pool, config, plan.sampling_rate, sample_rng)
            private = lm.start(
                [prompts.prompt(frame, s) for s in subsets], config.max_new_tokens, length=worst
            )  # padded to the public worst case: the shape never depends on the shots
        for _ in range(config.max_new_tokens):
            if config.resample == "token":
                subsets = draw_subsets(pool, config, plan.sampling_rate, sample_rng)
                private = lm.score(
                    [prompts.prompt(frame, s) + generated for s in subsets],
                    length=worst + len(generated),
                )  # padded to the public worst case, as a session is
            # the public prompt's log-probs [1, V], from a call whose inputs are all public
            public_row = np.asarray(lm.score([public + generated]), np.float32)[:1]
            logprobs = np.vstack([public_row, private])
            token = release_token(logprobs, config, plan, noise_rng)
            released += 1
            if on_token is not None:
                on_token(released, plan)
            if token in lm.eos_ids or (config.stop_at_newline and "\n" in lm.decode([token])):
                break
            generated.append(token)
            if config.resample == "example" and len(generated) < config.max_new_tokens:
                private = lm.append(token)
        texts.append(lm.decode(generated).strip())
    return FewShotResult(texts, plan, released, receipt)
