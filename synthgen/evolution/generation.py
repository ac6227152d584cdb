"""The Private Evolution loop: public population, DP votes, selection, public variations.

Each iteration's DP vote (`synthgen.privacy.nn_histogram`) draws each label's samples;
the best distinct ones stay and the LM varies the drawn ones. The last draw, with
replacement as in PE's Algorithm 1, is the release. See docs/guides/evolution.md.

Privacy:
  Unit: one private sample; add/remove-one. Each iteration is one Gaussian mechanism of
  L2 sensitivity sqrt(k), noise std sigma * sqrt(k); the threshold, draws, variations and
  next embeddings are post-processing of released histograms and public prompts. T
  iterations compose to `plan.event` (PLD), checked against the ledger before any work and
  charged before the first histogram. Rows whose label is not in the public list are
  dropped row by row (a stable transformation). Nothing private is logged or returned: the
  progress callback gets stage names and public counts.

References: Lin et al. 2024 (PE, ICLR 2024); Xie et al. 2024 (Aug-PE, ICML 2024).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from synthgen.evolution.config import EvolutionConfig
from synthgen.evolution.plan import EvolutionPlan, plan_evolution
from synthgen.evolution.sampler import TextSampler
from synthgen.fewshot.plan import resolve_delta
from synthgen.privacy.nn_histogram import dp_nn_histogram, nearest_neighbour_votes
from synthgen.privacy.receipts import Payer, Receipt, paid

Embed = Callable[[Sequence[str]], np.ndarray]
# progress(stage, done, total): stage is "initial", "histogram" or "variation"
Progress = Callable[[str, int, int], None]


@dataclasses.dataclass
class EvolutionResult:
    """The released samples (label, text) and DP figures of the run.

    Attributes:
      texts: released synthetic samples.
      labels: their labels.
      plan: the guarantee.
      selected_share: per iteration, the share of candidates whose noisy count passed the
        threshold (post-processing of released histograms).
      samples_generated: LM samples generated (public work).
      generation_seconds: time spent in the LM (public work; not for release folders).
      receipt: the receipt of the run's charge (None: an uncharged run).
    """

    texts: list[str]
    labels: list[str]
    plan: EvolutionPlan
    selected_share: list[float]
    samples_generated: int
    generation_seconds: float
    receipt: Receipt | None = None


def initial_prompts(config: EvolutionConfig) -> list[tuple[str, str]]:
    """(label, prompt) of the first population, label by label (public)."""
    return [
        (label, config.initial_prompt.format(label=label))
        for label, n in zip(config.labels, config.population_per_label(), strict=True)
        for _ in range(n)
    ]


def _check_plan(plan: EvolutionPlan, config: EvolutionConfig) -> None:
    """Refuses a plan that is not `plan_evolution(config)`: the metadata states the plan's
    epsilon, which must be the one its noise gives. A noise-off audit plan (epsilon = inf,
    never chargeable) is compared on the config's public settings only."""
    if math.isfinite(plan.epsilon):
        same = plan == plan_evolution(config)
    else:
        same = (
            plan.iterations == config.iterations
            and plan.votes == config.votes
            and plan.public_size == config.public_size
            and plan.delta == resolve_delta(config.delta, config.public_size)
            and math.isclose(plan.threshold_count, config.threshold * plan.noise_std)
        )
    if not same:
        raise ValueError("the plan was not made from this config (plan_evolution(config))")


def check_private_size(
    config: EvolutionConfig, private_labels: Sequence[str] | None, num_private: int
) -> None:
    """ValueError if there are more private samples (rows of a label outside `config.labels`
    not counted) than the declared size N, never printing their count: delta, below 1/N,
    would not be small for them. A command calls it before it admits the rows."""
    if config.labels != ("",) and private_labels is not None:
        known = set(config.labels)
        num_private = sum(str(label) in known for label in private_labels)
    if num_private > config.public_size:
        raise ValueError(
            f"the private data holds more samples than its declared size N={config.public_size}:"
            " delta, below 1/N, would not be small for it; declare N at least the real count"
        )


def _group_draw(
    noisy: np.ndarray, groups: np.ndarray, group: int, n: int, rng: np.random.Generator
) -> list[int]:
    """n candidates of `group` drawn in proportion to their noisy counts (uniformly when
    none passed the threshold): post-processing of the released histogram."""
    members = np.flatnonzero(groups == group)
    weights = np.clip(noisy[members], 0.0, None)
    total = weights.sum()
    p = weights / total if total > 0 else np.full(len(members), 1.0 / len(members))
    return [int(i) for i in members[rng.choice(len(members), size=n, replace=True, p=p)]]


def evolve(
    sampler: TextSampler,
    embed: Embed,
    private_texts: Sequence[str],
    config: EvolutionConfig,
    *,
    rng: np.random.Generator,
    private_labels: Sequence[str] | None = None,
    initial: Sequence[str] | None = None,
    private_embeddings: np.ndarray | None = None,
    pay: Payer | None = None,
    plan: EvolutionPlan | None = None,
    progress: Progress | None = None,
) -> EvolutionResult:
    """Runs Private Evolution and returns `config.num_samples` released samples.

    Args:
      sampler: the LM, sampling continuations of public prompts (`make_sampler`).
      embed: texts -> embeddings [n, d] (a public encoder, e.g. all-MiniLM-L6-v2).
      private_texts: the private samples.
      config: public parameters.
      rng: the mechanism's secret randomness (production: `secure_rng()`).
      private_labels: label of each private sample (needed when `config.labels` names
        labels); rows with a label outside the list are dropped.
      initial: a public first population (in `initial_prompts` order) instead of
        generating it, e.g. shared by runs at several epsilons.
      private_embeddings: `embed(private_texts)`, if already computed (row for row).
      pay: the caller's payer (`synthgen.privacy.receipts.ledger_payer`): checked before
        any work, paid once before the first histogram; None: an uncharged run.
      plan: the plan (default `plan_evolution(config)`).
      progress: callback (stage, done, total), public counts only.

    Returns:
      The release, its plan and public figures of the run.

    Raises:
      BudgetExceededError: the ledger refuses the charge (nothing generated or charged).
      ValueError: bad arguments.

    Privacy:
      (plan.epsilon, plan.delta)-DP for one private sample, add/remove-one (module docstring).
    """
    import time

    if plan is None:
        plan = plan_evolution(config)
    else:
        _check_plan(plan, config)
    labelled = config.labels != ("",)
    if labelled and private_labels is None:
        raise ValueError("config.labels names labels: pass private_labels")
    if private_labels is not None and len(private_labels) != len(private_texts):
        raise ValueError("one label per private sample is needed")
    group_of = {label: g for g, label in enumerate(config.labels)}
    if labelled:
        keep = [i for i, label in enumerate(private_labels) if str(label) in group_of]
        groups = np.array([group_of[str(private_labels[i])] for i in keep], np.int64)
    else:
        keep, groups = list(range(len(private_texts))), np.zeros(len(private_texts), np.int64)
    if private_embeddings is not None and len(private_embeddings) != len(private_texts):
        raise ValueError("private_embeddings needs one row per private sample")
    check_private_size(config, private_labels, len(private_texts))
    if pay is not None:
        pay.check(plan)
    hist_rng, draw_rng, lm_rng = rng.spawn(3)
    report = progress or (lambda stage, done, total: None)
    seconds, generated = 0.0, 0

    def sample(prompts: list[str]) -> list[str]:
        nonlocal seconds, generated
        began = time.perf_counter()
        texts = sampler.sample(prompts, int(lm_rng.integers(2**62)))
        seconds += time.perf_counter() - began
        if len(texts) != len(prompts):
            raise ValueError(f"the sampler returned {len(texts)} texts for {len(prompts)} prompts")
        generated += len(texts)
        return list(texts)

    def generate(stage: str, prompts: list[str]) -> list[str]:
        """LM samples of public prompts; empty ones are sampled once more (public work)."""
        out: list[str] = []
        step = max(1, getattr(sampler, "batch_size", len(prompts)))
        for start in range(0, len(prompts), step):
            out.extend(sample(prompts[start : start + step]))
            report(stage, len(out), len(prompts))
        empty = [i for i, text in enumerate(out) if not text.strip()]
        for start in range(0, len(empty), step):
            again = empty[start : start + step]
            for i, text in zip(again, sample([prompts[i] for i in again]), strict=True):
                out[i] = text
        return out

    first = initial_prompts(config)
    if initial is None:
        population = generate("initial", [prompt for _, prompt in first])
    else:
        if len(initial) != len(first):
            raise ValueError(f"initial holds {len(initial)} samples, the config {len(first)}")
        population = list(initial)
    population_labels = [label for label, _ in first]
    synthetic_emb = np.asarray(embed(population), np.float32)
    if private_embeddings is not None:
        private_emb = np.asarray(private_embeddings, np.float32)[keep]
    elif keep:
        private_emb = np.asarray(embed([private_texts[i] for i in keep]), np.float32)
    else:
        private_emb = np.zeros((0, synthetic_emb.shape[1]), np.float32)
    if private_emb.ndim != 2 or private_emb.shape[1] != synthetic_emb.shape[1]:
        raise ValueError(  # widths only, before any charge
            f"private and synthetic embeddings differ in width: {private_emb.shape[-1]} and "
            f"{synthetic_emb.shape[1]}"
        )
    description = (
        f"Private Evolution: {plan.iterations} DP NN histograms, "
        f"sigma={plan.noise_multiplier:.4g}, eps={plan.epsilon:.4g}"
    )
    receipt = paid(pay, plan, description)
    released = config.samples_per_label()
    sizes = config.population_per_label()
    shares: list[float] = []
    for t in range(plan.iterations):
        report("histogram", t, plan.iterations)
        if t > 0:
            synthetic_emb = np.asarray(embed(population), np.float32)
        c_groups = np.array([group_of[label] for label in population_labels], np.int64)
        counts = nearest_neighbour_votes(
            private_emb,
            synthetic_emb,
            votes=plan.votes,
            private_groups=groups,
            candidate_groups=c_groups,
        )
        noisy = dp_nn_histogram(
            counts,
            noise_multiplier=plan.noise_multiplier,
            votes=plan.votes,
            threshold=plan.threshold_count,
            rng=hist_rng,
        )
        del counts
        shares.append(float(np.mean(noisy > 0)))
        report("histogram", t + 1, plan.iterations)
        if t == plan.iterations - 1:
            picks = [
                i
                for g in range(len(config.labels))
                for i in _group_draw(noisy, c_groups, g, released[g], draw_rng)
            ]
            population = [population[i] for i in picks]
            population_labels = [population_labels[i] for i in picks]
            break
        kept: list[list[str]] = []
        prompts: list[str] = []
        for g, label in enumerate(config.labels):
            members = np.flatnonzero(c_groups == g)
            ranked = members[np.argsort(-noisy[members], kind="stable")]
            parents = [i for i in ranked if noisy[i] > 0][: int(config.keep_share * sizes[g])]
            kept.append([population[i] for i in parents])
            picks = _group_draw(noisy, c_groups, g, sizes[g] - len(parents), draw_rng)
            prompts += [
                config.variation_prompt.format(label=label, text=population[i]) for i in picks
            ]
        variations = iter(generate("variation", prompts))
        population, population_labels = [], []
        for g, label in enumerate(config.labels):
            new = kept[g] + [next(variations) for _ in range(sizes[g] - len(kept[g]))]
            population += new
            population_labels += [label] * len(new)
    return EvolutionResult(population, population_labels, plan, shares, generated, seconds, receipt)
