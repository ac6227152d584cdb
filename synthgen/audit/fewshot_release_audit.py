"""One-run canary audit of DP few-shot generation's released text: a lower bound on its epsilon.

The design shared with Private Evolution's audit is `synthgen.audit.release_audit`'s. For
the few-shot generator (`synthgen.fewshot`, Tang et al. 2024):

  * A canary is one private example whose text is a typical prefix followed by a secret
    of `secret_words` public words (`FEWSHOT_CANARY`: "The secret words are <w1 w2 w3>.").
    Each canary is included with probability 1/2.
  * ONE run of `fewshot.generate` on the ordinary rows plus the included canaries, with
    `num_texts` public targets (one released text each) and the prompt layout of
    `synthgen generate-docs` without labels, whose public stem ends with the canaries'
    prefix (`TEMPLATE`: "... Paragraph: The secret words are"). Every released text is
    thus a continuation of the prefix, and a prompt that holds a canary invites the LM to
    copy its secret there (in-context copying is what few-shot generation can leak; Panda
    et al. 2025 likewise score a secret after its prefix). The template is public and
    the same in both worlds, so the claim is unchanged by it.
  * Score of a canary: the most of its secret found in any released text
    (`release_audit.secret_word_scores`: the longest in-order run of its words, the
    number of its words as a tie-break). Only the released texts are read.

The claim. Unit: one private example, add/remove-one (`fewshot.RELATION`); a canary is one
example, inserted once. The plan (`fewshot_plan`) is made from public figures only:
public_pool_size = ordinary rows + m (every canary counted as if inserted), so the
sampling rate q = M * shots / public_pool_size, delta (default 1 / (10 public_pool_size))
and the noise do not depend on the coins; the pool is smaller than declared by the
excluded canaries, which `allow_small_pools` runs as designed (each example still joins a
draw with probability exactly q). The claim is the plan's epsilon for `num_texts` x
`max_new_tokens` tokens. epsilon = math.inf keeps the plan's shape but switches the noise
off (multiplier `release_audit.NOISE_OFF`: the argmax of the mean, ties broken at random)
and the claim is then math.inf (no privacy claimed; never a violation).

Power. A canary can only be found if a prompt that holds it is copied into the release:
with resample="example" (one draw per text) a text's prompts are fixed for its whole
length, and with M = 1 prompt the release (noise off) is the LM's greedy continuation of
that prompt; with M > 1 the argmax of the mean still follows at most one prompt's copy, so
M = 1 is the cheapest way to the most copies. A text carries at most one secret, so at
most `num_texts` canaries can be found: the bound approaches the cap only when
`num_texts` is several times the m / 2 included canaries. Under noise the release is a
noisy argmax of M-averaged probabilities; at the epsilons of interest one prompt's vote
is far below the noise (std sigma sqrt(2) / M on probabilities) and the expected bound is
near 0: what the claim promises, not a weakness of the scores.

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
    subsets: int,
    shots: int,
    max_shots: int | None,
    shot_tokens: int,
    max_new_tokens: int,
    resample: str,
    mechanism: str,
    public_vocab: int | None,
    public_prior: float,
    delta: float | None,
) -> tuple[fewshot.FewShotConfig, fewshot.FewShotPlan]:
    """The audited run's config and plan, from public figures only (never the coins).

    Args:
      epsilon: the target epsilon; math.inf: the same plan shape with the noise off.
      num_private, num_canaries: the ordinary rows and m; public_pool_size = their sum.
      num_texts: released texts (one per target, one pool).
      subsets ... public_prior: the generator's hyper-parameters (`fewshot.FewShotConfig`).
      delta: None: the generator's default 1 / (10 public_pool_size).

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
        subsets=subsets,
        shots=shots,
        max_shots=max_shots,
        shot_tokens=shot_tokens,
        max_new_tokens=max_new_tokens,
        mechanism=mechanism,
        target_epsilon=float(epsilon) if private else None,
        # noise off: a placeholder noise fixes the plan's shape without a calibration
        noise_multiplier=None if private or mechanism != "gaussian" else 1.0,
        token_epsilon=None if private or mechanism != "rnm" else 1.0,
        delta=delta,
        public_vocab=public_vocab,
        public_prior=public_prior,
        resample=resample,
        allow_small_pools=True,
    )
    plan = fewshot.plan_privacy(config, num_texts * max_new_tokens)
    if not private:
        noise = {"noise_multiplier": release_audit.NOISE_OFF}
        if mechanism == "rnm":
            noise = {"token_epsilon": 1.0 / release_audit.NOISE_OFF}
        plan = dataclasses.replace(plan, epsilon=math.inf, **noise)
    return config, plan


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
      epsilon: the run's target epsilon; math.inf switches the noise off (claim: inf).
      canaries: m, each included with probability 1/2.
      private_texts: the ordinary private examples' texts; None: the first `num_private`
        wiki summaries (public stand-ins).
      public_texts: public documents for the secret words; None: the wiki summaries after
        the private stand-ins.
      num_private: ordinary rows when `private_texts` is None.
      num_texts: released texts (targets).
      subsets: M, prompts per token; shots, max_shots, shot_tokens, max_new_tokens,
        resample, mechanism, public_vocab, public_prior and delta are the generator's
        other settings (`fewshot_plan`).
      template: the prompt layout; its shot field must be `text`, its header and stem
        fieldless (the targets are empty).
      canary_template: a canary's text, with "{secret}" (and optionally "{name}").
      secret_words: words per secret.
      significance: level of both bounds (0.05: 95%).
      model: a public label for the result.
      seed: None (production): 128 bits of OS entropy; fixed seeds are for tests only.
      work_dir: a PRIVATE folder for the coins, scores and released texts (None: memory).
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
        epsilon=epsilon,
        canaries=canaries,
        significance=significance,
        canary_template=canary_template,
        secret_words=secret_words,
        seed=seed,
        work_dir=work_dir,
    )
    if num_texts < 1 or secret_words < 1:
        raise ValueError(f"need num_texts >= 1 and secret_words >= 1, got {num_texts=}")
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
    figures, full_in, full_out = cell.figures(
        OBSERVABLE,
        scores,
        coins,
        released.texts,
        found_at=secret_words,  # the whole secret, in order, in some text
        tag="fewshot",
        plan=plan,
    )
    del scores, coins, drawn
    return cell.result(
        FewShotPowerResult,
        figures,
        model=model,
        num_private=len(private_texts),
        num_texts=num_texts,
        max_shots=config.shots_cap,
        public_pool_size=config.public_pool_size,
        sampling_rate=plan.sampling_rate,
        noise_multiplier=plan.noise_multiplier,
        token_epsilon=plan.token_epsilon,
        full_secret_in=full_in,
        full_secret_out=full_out,
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


def run_fewshot_power_cells(
    out_dir: str | Path,
    lm: NextTokenLM,
    epsilons: Sequence[float],
    *,
    label: str = "fewshot",
    canaries: int = 1000,
    **options,
) -> list[FewShotPowerResult]:
    """Runs (or reads back) one few-shot cell per epsilon; resumable by cell.

    Args:
      out_dir: the results folder (aggregates only): `fewshot_power_<label>_m<m>_eps<tag>.json`.
      lm: the LM backend.
      epsilons: target epsilons; math.inf is the noise-off cell.
      label: a public, file-name-safe label of the setting.
      canaries: m per cell.
      **options: `release_audit.run_cells`'s seed (cell k uses seed + k), log and work_dir,
        and further `run_fewshot_power_cell` arguments.

    Returns:
      One `FewShotPowerResult` per epsilon, in order.
    """
    return release_audit.run_cells(
        out_dir,
        "fewshot_power",
        label,
        epsilons,
        canaries,
        run_fewshot_power_cell,
        FewShotPowerResult,
        backend=lm,
        **options,
    )
