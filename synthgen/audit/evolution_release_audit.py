"""One-run canary audit of Private Evolution's DP vote: a lower bound on its epsilon.

It bounds the epsilon of PE's private step (`synthgen.evolution`, Lin et al. 2024), the DP
nearest-neighbour histogram and what `evolve` draws from it, under a worst-case public
population; not the leakage of a realistic run, whose population the LM writes. The design
is `release_audit`'s. PE never shows private text to the LM, so every canary is made an
outlier (`EVOLUTION_CANARY`: an invented subject, distinct per canary, and a secret), and
the first population, fixed before the coins, holds one bait per canary (its own public
text), a copy of each ordinary sample (`ordinary_candidates`) and public fillers: an
included canary votes for its bait, an excluded one's bait gets no vote. ONE run of
`evolution.evolve`; a canary's score is its largest cosine similarity to a released sample
(`score_embed`).

The claim (`evolution_plan`): one private sample, add/remove-one (`nn_histogram.RELATION`),
T Gaussian histograms of L2 sensitivity sqrt(votes) composed by the PLD accountant, with
public_size = ordinary rows + m fixing the default delta, so neither delta nor sigma reads
the coins. epsilon = math.inf runs the same loop with the noise off
(`release_audit.NOISE_OFF`) and claims nothing. Why the copies are legitimate and what
limits the power: docs/guides/audits.md ("Few-shot, Private Evolution and DP-RAG with
power").

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
      epsilon, canaries, significance, canary_template, secret_words, seed, work_dir: the
        audit's (`release_audit.ReleaseCell`; the template needs "{name}").
      embed: the run's public encoder (texts -> [n, d]); default `word_embedding`.
      score_embed: the scoring encoder (default `embed`).
      private_texts, public_texts, num_private: the ordinary private samples and the
        public documents for the secret words and fillers (`release_audit.wiki_stand_ins`).
      fillers: public documents among the first population, beside the m baits.
      ordinary_candidates: put a copy of each ordinary sample in the first population.
        For public stand-ins only: with real private samples, their copies would sit in a
        population the release draws from, and the release would not be DP for them.
      num_samples: released samples; default the population (m + ordinary copies +
        fillers). A larger value pads the population with public documents up to it.
      iterations: T, DP histograms; votes, threshold, keep_share, max_new_tokens, delta
        and the keyword options are the generator's other public settings
        (`evolution.EvolutionConfig`).
      model, encoder: public labels for the result.
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
        epsilon, canaries, significance, canary_template, secret_words, seed, work_dir
    )
    release_audit.check_canary_template(canary_template, name=True)  # outliers: named
    if fillers < 0:
        raise ValueError(f"need fillers >= 0, got {fillers=}")
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
    return cell.result(
        EvolutionPowerResult,
        OBSERVABLE,
        scores,
        coins,
        result.texts,
        found_at=1.0 - 1e-4,  # a released bait, up to the encoder's rounding
        found=("bait_in", "bait_out"),
        tag="evolution",
        plan=plan,
        model=model,
        encoder=encoder,
        num_private=len(private_texts),
        ordinary_candidates=ordinary_candidates,
        num_fillers=num_fillers,
        public_size=config.public_size,
        noise_multiplier=plan.noise_multiplier,
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


# run_evolution_power_cells(out_dir, backend, epsilons, *, label=, canaries=, **options)
run_evolution_power_cells = release_audit.cell_runner(
    "evolution_power", "evolution", run_evolution_power_cell, EvolutionPowerResult
)
