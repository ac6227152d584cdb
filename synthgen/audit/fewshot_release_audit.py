"""One-run canary audit of DP few-shot generation's released text: a lower bound on its epsilon.

The design is `release_audit`'s. For the few-shot generator (`synthgen.fewshot`, Tang et
al. 2024): a canary is one private example, a typical prefix then a secret of
`secret_words` public words (`FEWSHOT_CANARY`). ONE run of `fewshot.generate` releases
`num_texts` continuations of a public stem that ends in that prefix (`TEMPLATE`), so a
prompt that holds a canary invites the LM to copy its secret there (Panda et al. 2025
likewise score a secret after its prefix); the template is public and the same in both
worlds. A canary's score is the most of its secret found in any released text
(`release_audit.secret_word_scores`).

The claim (`fewshot_plan`): one private example, add/remove-one (`fewshot.RELATION`), for
`num_texts` x `max_new_tokens` tokens, the pool declared as ordinary rows + m (every canary
counted as if inserted), so the rate, delta and noise never read the coins; the excluded
canaries make the pool smaller than declared, which `allow_small_pools` runs as designed
(each example still joins a draw with probability exactly q). epsilon = math.inf keeps the
plan's shape with the noise off (`release_audit.NOISE_OFF`) and claims nothing. Why M = 1
and what limits the power: docs/guides/audits.md ("Few-shot, Private Evolution and DP-RAG
with power").

Privacy:
  See `synthgen.audit.release_audit`: the coins, the per-canary scores and the released
  texts (which, without noise, hold secrets) stay in memory or in the PRIVATE `work_dir`;
  `FewShotPowerResult` holds aggregates and public settings only. Not charged to a ledger.

References: Tang et al. 2024 (ICLR), DP few-shot generation; Steinke, Nasr & Jagielski
2023; Mahloujifar, Melis & Chaudhuri 2024; Panda et al. 2025.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from synthgen import fewshot
from synthgen.audit import release_audit
from synthgen.audit.whitebox import CellResult
from synthgen.next_token import NextTokenLM
from synthgen.privacy.rng import secure_rng

OBSERVABLE = "secret_words_found"
CANARY_PREFIX = "The secret words are"
FEWSHOT_CANARY = CANARY_PREFIX + " {secret}."
# `synthgen generate-docs`'s layout without labels, the stem ending in the canaries' public
# prefix: every released text is the continuation of that prefix (Panda et al. 2025 score a
# secret given its prefix), so a canary in a prompt is copied where the secret belongs.
TEMPLATE = fewshot.PromptTemplate(
    header="Here are example paragraphs.\n\n",
    shot="Paragraph: {text}\n\n",
    stem="Paragraph: " + CANARY_PREFIX,
)


@dataclasses.dataclass(frozen=True)
class FewShotPowerResult(CellResult):
    """The aggregate figures of one few-shot cell (what a report may show).

    `claimed_epsilon` is the plan's epsilon (math.inf without noise); `stats` holds the
    one observable (`OBSERVABLE`). `full_secret_in` / `full_secret_out`: how many included
    / excluded canaries had their whole secret, in order, in some released text.
    `generate_seconds` / `seconds` are wall times of work on the private rows (public
    stand-ins in the default cells; with real private rows, treat them as private).
    """

    AUDIT = "few-shot (canaries in prompts)"  # named in the audit-power tables and plots

    num_private: int
    secret_words: int
    num_texts: int
    subsets: int
    shots: int
    max_shots: int
    shot_tokens: int
    max_new_tokens: int
    resample: str
    mechanism: str
    public_vocab: int | None
    public_pool_size: int
    sampling_rate: float
    noise_multiplier: float | None
    token_epsilon: float | None
    full_secret_in: int
    full_secret_out: int
    tokens_released: int
    generate_seconds: float


def fewshot_plan(
    epsilon: float,
    *,
    num_private: int,
    num_canaries: int,
    num_texts: int,
    mechanism: str,
    **settings,
) -> tuple[fewshot.FewShotConfig, fewshot.FewShotPlan]:
    """The audited run's config and plan, from public figures only (never the coins).

    Args:
      epsilon: the target epsilon; math.inf: the same plan shape with the noise off.
      num_private, num_canaries: the ordinary rows and m; public_pool_size = their sum.
      num_texts: released texts (one per target, one pool).
      mechanism, settings: the generator's other hyper-parameters
        (`fewshot.FewShotConfig`: subsets ... public_prior; delta None: the generator's
        default 1 / (10 public_pool_size)).

    Returns:
      (config, plan): the plan's epsilon is the claim (math.inf without noise).

    Privacy:
      One private example under add/remove-one; `fewshot.plan_privacy` for a pool of
      declared size num_private + m and num_texts x max_new_tokens tokens (Tang et al.
      2024). No private count enters.
    """
    private = math.isfinite(epsilon)
    config = fewshot.FewShotConfig(
        public_pool_size=num_private + num_canaries,
        mechanism=mechanism,
        target_epsilon=float(epsilon) if private else None,
        # noise off: a placeholder noise fixes the plan's shape without a calibration
        noise_multiplier=None if private or mechanism != "gaussian" else 1.0,
        token_epsilon=None if private or mechanism != "rnm" else 1.0,
        allow_small_pools=True,
        **settings,
    )
    plan = fewshot.plan_privacy(config, num_texts * config.max_new_tokens)
    return config, plan if private else noise_off(plan)


def noise_off(plan: fewshot.FewShotPlan) -> fewshot.FewShotPlan:
    """`plan` with the noise switched off and no claim (epsilon math.inf): a Gaussian
    multiplier of `release_audit.NOISE_OFF` (rnm: token epsilon 1 / NOISE_OFF), i.e. the
    argmax of the mean with ties broken at random."""
    if plan.mechanism == "gaussian":
        return dataclasses.replace(plan, noise_multiplier=release_audit.NOISE_OFF, epsilon=math.inf)
    return dataclasses.replace(plan, token_epsilon=1.0 / release_audit.NOISE_OFF, epsilon=math.inf)


def run_fewshot_power_cell(
    lm: NextTokenLM,
    *,
    epsilon: float,
    canaries: int = 1000,
    private_texts: Sequence[str] | None = None,
    public_texts: Sequence[str] | None = None,
    num_private: int = 100,
    num_texts: int = 480,
    subsets: int = 1,
    shots: int = 4,
    max_shots: int | None = None,
    shot_tokens: int = 48,
    max_new_tokens: int = 10,
    resample: str = "example",
    mechanism: str = "gaussian",
    public_vocab: int | None = None,
    public_prior: float = 0.0,
    delta: float | None = None,
    template: fewshot.PromptTemplate = TEMPLATE,
    canary_template: str = FEWSHOT_CANARY,
    secret_words: int = 3,
    significance: float = 0.05,
    model: str = "",
    seed: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool = False,
) -> FewShotPowerResult:
    """One run of DP few-shot generation with m canaries among its private examples, audited.

    Args:
      lm: the frozen LM backend (`synthgen.lm_backends.load_backend`).
      epsilon, canaries, significance, canary_template, secret_words, seed, work_dir: the
        audit's (`release_audit.ReleaseCell`).
      private_texts, public_texts, num_private: the ordinary private examples' texts and
        the public documents for the secret words (`release_audit.wiki_stand_ins`).
      num_texts: released texts (targets).
      subsets: M, prompts per token; shots, max_shots, shot_tokens, max_new_tokens,
        resample, mechanism, public_vocab, public_prior and delta are the generator's
        other settings (`fewshot_plan`).
      template: the prompt layout; its shot field must be `text`, its header and stem
        fieldless (the targets are empty).
      model: a public label for the result.
      progress: a progress bar on stderr (released tokens only).

    Returns:
      The `FewShotPowerResult` (aggregates only).

    Raises:
      ValueError: bad arguments (before anything runs).

    Privacy:
      Unit: one private example, add/remove-one; the claim is `fewshot_plan`'s epsilon,
      fixed before the coins are drawn. The coins, scores and texts never leave this call
      except into `work_dir` (see the module docstring).
    """
    cell = release_audit.ReleaseCell(
        epsilon, canaries, significance, canary_template, secret_words, seed, work_dir
    )
    if num_texts < 1:
        raise ValueError(f"need num_texts >= 1, got {num_texts=}")
    shot_fields, target_fields = template.fields()
    if shot_fields != {"text"} or target_fields:
        raise ValueError(f"the template's shots must read only {{text}}, got {shot_fields=}")
    private_texts, public_texts = release_audit.wiki_stand_ins(
        num_private, 2000, private_texts, public_texts
    )
    # the generator's settings that the plan reads and the result records as given
    shape = dict(
        subsets=subsets,
        shots=shots,
        shot_tokens=shot_tokens,
        max_new_tokens=max_new_tokens,
        resample=resample,
        mechanism=mechanism,
        public_vocab=public_vocab,
    )
    config, plan = fewshot_plan(
        epsilon,
        num_private=len(private_texts),
        num_canaries=canaries,
        num_texts=num_texts,
        max_shots=max_shots,
        public_prior=public_prior,
        delta=delta,
        **shape,
    )
    drawn, coins, run_seed = cell.draw(public_texts, plan)
    rows = [{"text": t} for t in private_texts]
    rows += [{"text": drawn.texts[i]} for i in np.flatnonzero(coins)]
    on_token, close = _progress(progress, num_texts * max_new_tokens)
    generate_start = time.perf_counter()
    try:
        released = fewshot.generate(
            lm,
            rows,
            [{}] * num_texts,
            template,
            config,
            rng=secure_rng(run_seed),
            plan=plan,
            on_token=on_token,
        )
    finally:
        close()
    generate_seconds = time.perf_counter() - generate_start
    del rows
    scores = release_audit.secret_word_scores(drawn.secrets, released.texts)
    return cell.result(
        FewShotPowerResult,
        OBSERVABLE,
        scores,
        coins,
        released.texts,
        found_at=secret_words,  # the whole secret, in order, in some text
        found=("full_secret_in", "full_secret_out"),
        tag="fewshot",
        plan=plan,
        model=model,
        num_private=len(private_texts),
        num_texts=num_texts,
        max_shots=config.shots_cap,
        public_pool_size=config.public_pool_size,
        sampling_rate=plan.sampling_rate,
        noise_multiplier=plan.noise_multiplier,
        token_epsilon=plan.token_epsilon,
        tokens_released=released.tokens_released,
        generate_seconds=generate_seconds,
        **shape,
    )


def _progress(enabled: bool, total: int) -> tuple[Callable | None, Callable[[], None]]:
    """(on_token, close): a tqdm bar of released tokens (a public count), or nothing."""
    if not enabled:
        return None, lambda: None
    import sys

    from tqdm import tqdm

    bar = tqdm(total=total, unit="tok", file=sys.stderr, desc="few-shot audit")
    return (lambda released, plan: bar.update(1)), bar.close


# run_fewshot_power_cells(out_dir, backend, epsilons, *, label=, canaries=, **options)
run_fewshot_power_cells = release_audit.cell_runner(
    "fewshot_power", "fewshot", run_fewshot_power_cell, FewShotPowerResult
)
