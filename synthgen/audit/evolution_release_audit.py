"""One-run canary audit of Private Evolution's DP vote: a lower bound on its epsilon.

What it measures: a lower bound on the epsilon of PE's private step, the DP
nearest-neighbour histogram and what `evolve` draws from it, under a worst-case public
population (one bait per canary). It is not a measure of the leakage of a realistic PE
run, whose population the LM writes and which varies it over T > 1 iterations.

The design shared with the few-shot audit is `synthgen.audit.release_audit`'s. Private
Evolution (`synthgen.evolution`, Lin et al. 2024; Xie et al. 2024) never shows private text
to the LM: a private sample only votes for its nearest public candidates, so its release
can carry a canary only by selecting candidates near it. The audit therefore makes every
canary an outlier and gives the vote something to move:

  * A canary is one private sample, `EVOLUTION_CANARY`: an invented subject (random
    syllables, distinct per canary, so no ordinary sample is near it) and a secret of
    `secret_words` public words. Each is included with probability 1/2.
  * The first population is fixed before the coins: one BAIT per canary (the canary's own
    text: canaries are public material, only the coins are secret), one copy of each
    ordinary sample (`ordinary_candidates`), and `fillers` public documents, padded with
    further public documents to `num_samples` when that is larger. An included canary
    votes for its own bait (distance 0) and an ordinary sample for its own copy, so an
    excluded canary's bait gets no vote at all (without the copies, a real encoder puts
    some ordinary samples nearer a bait than any filler, and those false positives tie
    with the true ones at the top of the scores). The copies are legitimate public
    input: the ordinary samples are the same in both worlds of every canary's
    neighbouring pair (the claim is about one canary), so nothing of the population
    depends on a coin.
  * ONE run of `evolution.evolve` (T = `iterations` histograms; T > 1 asks the LM for
    variations of the drawn candidates, public prompts only).
  * Score of a canary: the largest cosine similarity between its text and any released
    sample, under `score_embed` (default: the run's `embed`). Only the released texts are
    read. A released bait scores 1 (up to the encoder's rounding).

The claim. Unit: one private sample, add/remove-one (`nn_histogram.RELATION`). T Gaussian
histograms of L2 sensitivity sqrt(votes), composed by the PLD accountant
(`evolution.plan_evolution`); public_size = ordinary rows + m (every canary counted as if
inserted) fixes the default delta 1 / (10 public_size), so neither delta nor sigma depends
on the coins. The claim is the plan's epsilon. epsilon = math.inf runs the same loop with
noise multiplier `release_audit.NOISE_OFF` (exact counts, a threshold of ~0): the claim is
then math.inf (no privacy claimed; never a violation).

Power. Noise off, an included canary's bait holds one vote among the N = ordinary + in
votes, and the release draws `num_samples` candidates in proportion to the counts: it
holds the bait with probability about 1 - (1 - 1/N)^num_samples (86% at num_samples = 2N).
With noise, one vote must clear the threshold (`threshold` x sigma x sqrt(votes)) and the
draw: at sigma >~ 1 a single vote is rarely visible, which is what the claim says.

Privacy:
  See `synthgen.audit.release_audit`: the coins, scores and released samples stay in
  memory or in the PRIVATE `work_dir`; `EvolutionPowerResult` holds aggregates and public
  settings only. Not charged to a ledger.

References: Lin, Gopi, Kulkarni, Nori, Yekhanin 2024 (ICLR), Private Evolution; Xie et al.
2024 (ICML), Aug-PE; Steinke, Nasr & Jagielski 2023; Mahloujifar, Melis & Chaudhuri 2024.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from synthgen import evolution
from synthgen.audit import release_audit
from synthgen.audit.whitebox import CellResult
from synthgen.fewshot.plan import resolve_delta
from synthgen.privacy.rng import secure_rng

OBSERVABLE = "max_cosine_to_release"
EVOLUTION_CANARY = "{name} is known for {secret}."
Embed = Callable[[Sequence[str]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class EvolutionPowerResult(CellResult):
    """The aggregate figures of one Private Evolution cell (what a report may show).

    `claimed_epsilon` is the plan's epsilon (math.inf without noise). `bait_in` /
    `bait_out`: how many included / excluded canaries' baits are in the release (score
    >= 1 - 1e-4); `selected_share`: per iteration, the share of candidates whose noisy
    count passed the threshold (post-processing of the released histograms).
    `seconds` is the wall time of work on the private samples (public stand-ins in the
    default cells; with real private samples, treat it as private).
    """

    AUDIT = "Private Evolution (the DP vote)"  # named in the audit-power tables and plots

    encoder: str
    num_private: int
    ordinary_candidates: bool
    num_fillers: int
    secret_words: int
    population: int
    num_samples: int
    iterations: int
    votes: int
    threshold: float
    public_size: int
    noise_multiplier: float
    bait_in: int
    bait_out: int
    selected_share: tuple[float, ...]
    samples_generated: int
    generation_seconds: float

    @classmethod
    def from_dict(cls, data: dict) -> EvolutionPowerResult:
        return super().from_dict({**data, "selected_share": tuple(data["selected_share"])})


def evolution_plan(epsilon: float, config: evolution.EvolutionConfig) -> evolution.EvolutionPlan:
    """The plan of the audited run: `plan_evolution`, or the noise-off plan (claim inf).

    `config` must carry the noise `run_evolution_power_cell` gives it (a target epsilon, or
    `release_audit.NOISE_OFF` for epsilon = inf).
    """
    if math.isfinite(epsilon):
        return evolution.plan_evolution(config)
    sigma = release_audit.NOISE_OFF
    return evolution.EvolutionPlan(
        iterations=config.iterations,
        noise_multiplier=sigma,
        votes=config.votes,
        threshold_count=float(config.threshold * sigma * config.votes**0.5),
        public_size=config.public_size,
        epsilon=math.inf,
        delta=resolve_delta(config.delta, config.public_size),
    )


def run_evolution_power_cell(
    sampler: evolution.TextSampler | None = None,
    *,
    epsilon: float,
    canaries: int = 1000,
    embed: Embed = release_audit.word_embedding,
    score_embed: Embed | None = None,
    private_texts: Sequence[str] | None = None,
    public_texts: Sequence[str] | None = None,
    num_private: int = 100,
    fillers: int = 0,
    ordinary_candidates: bool = True,
    num_samples: int | None = None,
    iterations: int = 1,
    votes: int = 1,
    threshold: float = 2.0,
    keep_share: float = 0.25,
    max_new_tokens: int = 64,
    delta: float | None = None,
    canary_template: str = EVOLUTION_CANARY,
    secret_words: int = 3,
    significance: float = 0.05,
    model: str = "",
    encoder: str = "word-hash",
    seed: int | None = None,
    work_dir: str | Path | None = None,
    progress: bool = False,
    **options,
) -> EvolutionPowerResult:
    """One Private Evolution run with m canaries among its private samples, audited.

    Args:
      sampler: the LM (`evolution.make_sampler`); needed only when iterations > 1 (the
        first population is the public baits and fillers, never generated).
      epsilon: the run's target epsilon; math.inf switches the noise off (claim: inf).
      canaries: m, each included with probability 1/2.
      embed: the run's public encoder (texts -> [n, d]); default `word_embedding`.
      score_embed: the scoring encoder (default `embed`).
      private_texts: ordinary private samples; None: the first `num_private` wiki
        summaries (public stand-ins).
      public_texts: public documents for the secret words and the fillers; None: the wiki
        summaries after the private stand-ins.
      num_private: ordinary samples when `private_texts` is None.
      fillers: public documents among the first population, beside the m baits.
      ordinary_candidates: put a copy of each ordinary sample in the first population.
        For public stand-ins only: with real private samples, their copies would sit in a
        population the release draws from, and the release would not be DP for them.
      num_samples: released samples; default the population (m + ordinary copies +
        fillers). A larger value pads the population with public documents up to it.
      iterations: T, DP histograms; votes, threshold, keep_share, max_new_tokens, delta
        and the keyword options are the generator's other public settings
        (`evolution.EvolutionConfig`).
      canary_template: a canary's text, with "{secret}" and "{name}".
      secret_words: words per secret.
      significance: level of both bounds (0.05: 95%).
      model, encoder: public labels for the result.
      seed: None (production): 128 bits of OS entropy; fixed seeds are for tests only.
      work_dir: a PRIVATE folder for the coins, scores and released samples.
      progress: stage lines on stderr (public counts only).

    Returns:
      The `EvolutionPowerResult` (aggregates only).

    Raises:
      ValueError: bad arguments (before anything runs), e.g. iterations > 1 without a
        sampler, or too few public documents for the fillers.

    Privacy:
      Unit: one private sample, add/remove-one; the claim is the plan's epsilon for
      public_size = num_private + m, fixed before the coins are drawn. The coins, scores
      and samples never leave this call except into `work_dir`.
    """
    cell = release_audit.ReleaseCell(
        epsilon=epsilon,
        canaries=canaries,
        significance=significance,
        canary_template=canary_template,
        secret_words=secret_words,
        seed=seed,
        work_dir=work_dir,
        named_canaries=True,
    )
    if fillers < 0 or secret_words < 1:
        raise ValueError(f"need fillers >= 0 and secret_words >= 1, got {fillers=}")
    if iterations > 1 and sampler is None:
        raise ValueError(f"iterations={iterations} > 1 asks the LM for variations: pass a sampler")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples=}")
    private_texts, public_texts = release_audit.wiki_stand_ins(
        num_private, max(2000, fillers + (num_samples or 0)), private_texts, public_texts
    )
    copies = private_texts if ordinary_candidates else []
    population = canaries + len(copies) + fillers
    num_samples = population if num_samples is None else num_samples
    population = max(population, num_samples)
    num_fillers = population - canaries - len(copies)
    if len(public_texts) < num_fillers:
        raise ValueError(f"need {num_fillers} public documents for the fillers")
    # the run's settings that its config reads and the result records as given
    shape = dict(
        population=population,
        num_samples=num_samples,
        iterations=iterations,
        votes=votes,
        threshold=threshold,
    )
    noisy = math.isfinite(epsilon)
    config = evolution.EvolutionConfig(  # public figures only: public_size = ordinary + m
        target_epsilon=float(epsilon) if noisy else None,
        noise_multiplier=None if noisy else release_audit.NOISE_OFF,
        delta=delta,
        public_size=len(private_texts) + canaries,
        keep_share=keep_share,
        max_new_tokens=max_new_tokens,
        **shape,
        **options,
    )
    plan = evolution_plan(epsilon, config)
    drawn, coins, run_seed = cell.draw(public_texts, plan)
    initial = list(drawn.texts) + copies + public_texts[:num_fillers]  # no coin read
    private = private_texts + [drawn.texts[i] for i in np.flatnonzero(coins)]
    report = _report if progress else None
    result = evolution.evolve(
        sampler if sampler is not None else _NoSampler(),
        embed,
        private,
        config,
        rng=secure_rng(run_seed),
        initial=initial,
        plan=plan,
        progress=report,
    )
    del private
    scoring = score_embed or embed
    scores = release_audit.max_cosine_scores(
        np.asarray(scoring(list(drawn.texts))), np.asarray(scoring(list(result.texts)))
    )
    figures, bait_in, bait_out = cell.figures(
        OBSERVABLE,
        scores,
        coins,
        result.texts,
        found_at=1.0 - 1e-4,  # a released bait, up to the encoder's rounding
        tag="evolution",
        plan=plan,
    )
    del scores, coins, drawn
    return cell.result(
        EvolutionPowerResult,
        figures,
        model=model,
        encoder=encoder,
        num_private=len(private_texts),
        ordinary_candidates=ordinary_candidates,
        num_fillers=num_fillers,
        public_size=config.public_size,
        noise_multiplier=plan.noise_multiplier,
        bait_in=bait_in,
        bait_out=bait_out,
        selected_share=tuple(result.selected_share),
        samples_generated=result.samples_generated,
        generation_seconds=result.generation_seconds,
        **shape,
    )


class _NoSampler:
    """The sampler of a one-iteration run, which never generates (its population is given)."""

    def sample(self, prompts: Sequence[str], seed: int) -> list[str]:
        raise RuntimeError("a one-iteration audit run never asks the LM for text")


def _report(stage: str, done: int, total: int) -> None:
    print(f"evolution audit: {stage} {done}/{total}", file=sys.stderr)


def run_evolution_power_cells(
    out_dir: str | Path,
    sampler: evolution.TextSampler | None,
    epsilons: Sequence[float],
    *,
    label: str = "evolution",
    canaries: int = 1000,
    **options,
) -> list[EvolutionPowerResult]:
    """Runs (or reads back) one Private Evolution cell per epsilon; resumable by cell.

    Args:
      out_dir: the results folder (aggregates only): `evolution_power_<label>_m<m>_eps<tag>.json`.
      sampler: the LM (None for one-iteration cells).
      epsilons: target epsilons; math.inf is the noise-off cell.
      label: a public, file-name-safe label of the setting.
      canaries: m per cell.
      **options: `release_audit.run_cells`'s seed (cell k uses seed + k), log and work_dir,
        and further `run_evolution_power_cell` arguments (embed, sizes, ...).

    Returns:
      One `EvolutionPowerResult` per epsilon, in order.
    """
    return release_audit.run_cells(
        out_dir,
        "evolution_power",
        label,
        epsilons,
        canaries,
        run_evolution_power_cell,
        EvolutionPowerResult,
        backend=sampler,
        **options,
    )
