"""Canary audit of DP few-shot generation (Tang et al. 2024): exposure, extraction, membership.

Digit-secret canaries (`canaries.make_canaries`, kind "secret") are private examples whose
text field is `"<key> <secret>"`, each included with probability 1/2 and repeated
`repetitions` times. For each epsilon (math.inf = noise off):

  exposure    the log-perplexity (bits) of each secret under the probability that the
              MECHANISM RELEASES its tokens after `lead + key` (`score_canaries`: the M
              prompts drawn as `fewshot.generate` draws them, Monte Carlo over the
              subsample, exact in the noise: `release_logprob`), against reference secrets
              with the same key and draws; rank and exposure as Carlini et al. 2019, and
              `median_ratio_bits`, the size of the bias, which noise cannot squeeze.
  extraction  a secret found verbatim in `fewshot.generate`'s texts, and the longest
              prefix of it found.
  membership  AUC and TPR at 1% FPR per repetitions group, descriptive only: no epsilon
              bound (`_membership`).

Why the scored probability is the release's own, and the one approximation (one draw per
text): docs/guides/audits.md ("The few-shot generator").

Privacy:
  The audit reads the private rows. The canary record (keys, secrets, in/out labels,
  references), the per-canary scores and the released texts (which, at epsilon = inf, hold
  secrets) stay in the PRIVATE `work_dir`; the returned dict holds aggregate figures only
  (per cell and group: medians, rates, AUC, TPR, epsilon bounds) and the public plans. The
  runs are not charged to a ledger: they are never released. Publishing the figures of a
  run at epsilon costs that run's epsilon; the epsilon = inf row is NOT private.

References: Tang et al. 2024 (ICLR), DP few-shot generation; Carlini et al. 2019 (secret
sharer, exposure); Steinke, Nasr, Jagielski 2023 (one-run audit); Carranza et al. 2023.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from synthgen import fewshot
from synthgen.audit import auditor, canaries, exposure
from synthgen.audit.claims import epsilon_tag
from synthgen.audit.fewshot_release_audit import noise_off
from synthgen.fewshot.prompts import _Prompts
from synthgen.fewshot.sampling import _pools
from synthgen.lm_backends import NextTokenLM
from synthgen.privacy.rng import secure_rng
from synthgen.work_folder import private_folder

FLOOR_BITS = 64.0  # a token's probability is floored at 2^-64 (log-perplexity stays finite)
TIE_WEIGHT = 1e-6  # epsilon = inf only: weight of the noise-free mean's bits (tie-break)
SCORES = "fewshot_scores"
TEXTS = "fewshot_texts"
_LN2 = math.log(2.0)


def run_plan(
    rows: Sequence[Mapping[str, Any]],
    targets: Sequence[Mapping[str, Any]],
    template: fewshot.PromptTemplate,
    config: fewshot.FewShotConfig,
    epsilon: float,
    pool_field: str | None,
) -> tuple[fewshot.FewShotConfig, fewshot.FewShotPlan]:
    """The config and plan of the audit run at `epsilon`.

    A finite epsilon is a calibration target (`target_epsilon`); math.inf keeps the plan's
    shape (rate, tokens, delta) but switches the noise off
    (`fewshot_release_audit.noise_off`: the plan's epsilon is math.inf).
    """
    target = 1.0 if math.isinf(epsilon) else float(epsilon)
    config = dataclasses.replace(
        config, target_epsilon=target, noise_multiplier=None, token_epsilon=None
    )
    plan = fewshot.plan_for(rows, targets, template, config, pool_field=pool_field)
    return config, noise_off(plan) if math.isinf(epsilon) else plan


# ---- the probability that the mechanism releases a token ----------------------------------


def gaussian_win_logprob(scores: np.ndarray, index: int, std: float) -> float:
    """log P(argmax_c (scores_c + Z_c) = index), Z_c ~ N(0, std^2) independently.

    P = integral phi(z) prod_{c != index} Phi(z + (scores_index - scores_c) / std) dz. The
    integrand is log-concave with curvature >= 1, so all but e^-50 of its mass lies within
    10 of its mode: a coarse grid finds the mode, a fine trapezoid grid integrates around it
    (in log space, so tail probabilities far below float range stay exact). Equal competitor
    scores are grouped.
    """
    scores = np.asarray(scores, np.float64)
    gaps = (scores[index] - np.delete(scores, index)) / std
    gaps, counts = np.unique(gaps, return_counts=True)
    keep = gaps < 40.0  # log Phi(z + gap) == 0 in float64 for z >= -10 beyond this
    gaps, counts = gaps[keep], counts[keep]

    def log_integrand(z: np.ndarray) -> np.ndarray:
        if not gaps.size:
            return -0.5 * z**2
        terms = special.log_ndtr(z[:, None] + gaps[None, :]) @ counts
        return -0.5 * z**2 + terms

    top = max(10.0, float(-gaps.min()) + 10.0) if gaps.size else 10.0
    coarse = np.linspace(-10.0, top, 513)
    mode = coarse[int(np.argmax(log_integrand(coarse)))]
    fine = np.linspace(mode - 10.0, mode + 10.0, 1025)
    values = log_integrand(fine)
    weights = np.full(fine.size, fine[1] - fine[0])
    weights[[0, -1]] *= 0.5
    return float(special.logsumexp(values, b=weights) - 0.5 * math.log(2 * math.pi))


def release_logprob(
    logprobs: np.ndarray,
    token: int,
    config: fewshot.FewShotConfig,
    plan: fewshot.FewShotPlan,
) -> float:
    """Natural log of P(`release_token` returns `token`) given these [1 + M, V] log-probs.

    Exact in the mechanism's noise (Gaussian quadrature, the exponential mechanism's
    softmax, or the argmax at epsilon = inf), for the same candidates, mean and public
    prior as `fewshot.release_token`; -inf when `token` is not a candidate.
    """
    public = fewshot.distributions(logprobs[:1])[0]
    candidates = fewshot.public_candidates(public, config)
    where = np.flatnonzero(candidates == token)
    if not where.size:
        return -math.inf
    mean = fewshot.private_mean(logprobs)[candidates]
    prior = config.public_prior * public[candidates]
    m = config.subsets
    if math.isinf(plan.epsilon):  # noise off: the argmax, ties split evenly
        scores = mean + prior
        best = np.flatnonzero(scores == scores.max())
        return -math.log(best.size) if int(where[0]) in best else -math.inf
    if plan.mechanism == "gaussian":
        std = plan.noise_multiplier * math.sqrt(2) / m
        return gaussian_win_logprob(mean + prior, int(where[0]), std)
    utilities = mean + prior if config.public_prior else mean
    logits = plan.token_epsilon * utilities / (2.0 * (1.0 / m))
    return float(logits[where[0]] - special.logsumexp(logits))


def _split(lm: NextTokenLM, lead: str, key: str, secret: str) -> tuple[list[int], list[int]]:
    """(ids of the released prefix lead + key, ids of " " + secret after it)."""
    prefix = lm.encode(lead + key)
    whole = lm.encode(f"{lead}{key} {secret}")
    if whole[: len(prefix)] == prefix:
        return prefix, whole[len(prefix) :]
    return prefix, lm.encode(f" {secret}")


def score_canaries(
    lm: NextTokenLM,
    rows: Sequence[Mapping[str, Any]],
    drawn: Sequence[canaries.Canary],
    references: Sequence[Sequence[str]],
    template: fewshot.PromptTemplate,
    target: Mapping[str, Any],
    runs: Sequence[tuple[fewshot.FewShotConfig, fewshot.FewShotPlan]],
    *,
    pool_field: str | None,
    lead: str,
    draws: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Log-perplexities (bits) under each run's release: [runs, canaries, 1 + references].

    Column 0 is the canary's secret, the rest its references; all share the canary's key
    and, per token position, the same `draws` subset draws. The subsets and means do not
    depend on epsilon (the rate is M * shots / public_pool_size), so each mean is computed
    once and scored under every run's noise.
    """
    config = runs[0][0]
    rate = runs[0][1].sampling_rate
    pool = _pools(rows, [target], pool_field, config.public_pool_size)[0]
    prompts = _Prompts(lm, template, rows, config.shot_tokens)
    frame = prompts.frame(target)
    public = prompts.prompt(frame, [])
    worst = prompts.worst_length([frame], config.shots_cap)  # the release's padding
    per_token = config.resample == "token"
    width = 1 + len(references[0])
    out = np.zeros((len(runs), len(drawn), width))
    for i, (canary, refs) in enumerate(zip(drawn, references, strict=True)):
        splits = [_split(lm, lead, canary.key, s) for s in [canary.secret, *refs]]
        length = max(len(ids) for _, ids in splits)
        if per_token:
            subsets = [
                [fewshot.draw_subsets(pool, config, rate, rng) for _ in range(length)]
                for _ in range(draws)
            ]
        else:
            subsets = [
                [fewshot.draw_subsets(pool, config, rate, rng)] * length for _ in range(draws)
            ]
        for j, (prefix, ids) in enumerate(splits):
            # logp[run, draw, position] (natural log); mean_bits: noise-free tie-break.
            logp = np.zeros((len(runs), draws, len(ids)))
            mean_bits = 0.0
            for t, token in enumerate(ids):
                released = prefix + ids[:t]
                public_row = np.asarray(lm.score([public + released]), np.float32)[:1]
                for d in range(draws):
                    rows = [prompts.prompt(frame, s) + released for s in subsets[d][t]]
                    private = lm.score(rows, length=worst + len(released))
                    logprobs = np.vstack([public_row, np.asarray(private, np.float32)])
                    mean_p = fewshot.private_mean(logprobs)[token]
                    mean_bits -= math.log2(max(mean_p, 2.0**-FLOOR_BITS)) / draws
                    for k, (run_config, plan) in enumerate(runs):
                        logp[k, d, t] = release_logprob(logprobs, token, run_config, plan)
            floor = -FLOOR_BITS * _LN2
            if per_token:  # independent draws per token: average each token, then multiply
                tokens = special.logsumexp(logp, axis=1) - math.log(draws)
                bits = -np.maximum(tokens, floor).sum(axis=1) / _LN2
            else:  # one draw per text: average the sequence probabilities over draws
                seqs = np.maximum(logp, floor).sum(axis=2)
                bits = -(special.logsumexp(seqs, axis=1) - math.log(draws)) / _LN2
            for k, (_, plan) in enumerate(runs):
                tie = TIE_WEIGHT * mean_bits if math.isinf(plan.epsilon) else 0.0
                out[k, i, j] = bits[k] + tie
    return out


# ---- extraction from released texts --------------------------------------------------------


def longest_prefix_found(secret: str, texts: Sequence[str]) -> int:
    """Length of the longest prefix of `secret` that occurs in any of `texts`."""
    best = 0
    for text in texts:
        while best < len(secret) and secret[: best + 1] in text:
            best += 1
    return best


# ---- the audit ----------------------------------------------------------------------------


def _cells(drawn, ppl: np.ndarray, extracted: np.ndarray, prefixes: np.ndarray) -> list[dict]:
    return [
        {
            "kind": "secret",
            "repetitions": reps,
            "included": included,
            **exposure.group_figures(ppl, idx, [10.0**canaries.DIGITS] * len(idx)),
            "extracted": float(np.mean(extracted[idx])),
            "median_prefix_digits": float(np.median(prefixes[idx])),
            "median_ratio_bits": float(np.median(np.median(ppl[idx, 1:], axis=1) - ppl[idx, 0])),
        }
        for reps, included, idx in canaries.in_out_groups(drawn)
    ]


def _membership(drawn, ppl: np.ndarray, plan, significance: float) -> tuple[list, dict]:
    def figures(inside, outside, claim_eps, claim_delta) -> dict:
        # Descriptive figures only. The scores are exact release probabilities computed
        # from the private rows, not outputs of one DP run: under honest (r eps)-DP an
        # inserted canary keeps a fixed bias, so in and out canaries separate perfectly
        # and an epsilon "lower bound" from them would refute true claims. The one-run
        # and Clopper-Pearson bounds are therefore not computed here.
        library = auditor.canary_auditor(inside, outside)  # jax-privacy's auditor
        return dict(
            num_in=len(inside),
            num_out=len(outside),
            auroc=float(library.attack_auroc()),
            tpr_at_1pct_fpr=float(library.tpr_at_given_fpr(auditor.TPR_FPR)),
            epsilon_one_run=None,
            epsilon_clopper_pearson=None,
            violation=False,
            violation_message=None,
            note="exact release probabilities: no epsilon lower bound (not one DP run)",
        )

    score = np.median(ppl[:, 1:], axis=1) - ppl[:, 0]  # higher: more likely inserted
    return auditor.membership_rows(drawn, score, plan.epsilon, plan.delta, figures)


def canary_rows(
    drawn: Sequence[canaries.Canary], text_field: str, canary_fields: Mapping[str, Any]
) -> list[dict]:
    """The included canaries as private rows, each repeated `repetitions` times."""
    return [
        {**canary_fields, text_field: c.query}
        for c in drawn
        if c.included
        for _ in range(c.repetitions)
    ]


def run_fewshot_audit(
    lm: NextTokenLM,
    private_rows: Sequence[Mapping[str, Any]],
    config: fewshot.FewShotConfig,
    *,
    template: fewshot.PromptTemplate,
    targets: Sequence[Mapping[str, Any]],
    work_dir: str | Path,
    epsilons: Sequence[float] = (math.inf, 1.0),
    spec: canaries.CanarySpec | None = None,
    text_field: str = "text",
    pool_field: str | None = None,
    canary_fields: Mapping[str, Any] | None = None,
    score_target: Mapping[str, Any] | None = None,
    lead: str = " ",
    public_documents: Sequence[str] = (),
    draws: int = 8,
    significance: float = 0.05,
    out_dir: str | Path | None = None,
    seed: int | None = None,
) -> dict:
    """Audits DP few-shot generation with digit-secret canaries among its private examples.

    See the module docstring for what is measured. Per epsilon the returned run holds the
    plan's (epsilon, delta), per-(repetitions, included) cells (median rank and exposure,
    extraction rate, median longest secret prefix found) and descriptive membership figures
    per repetitions group (AUROC, TPR at 1% FPR and the ROC, by jax-privacy's
    `CanaryScoreAuditor` through `auditor`; no epsilon bound, see `_membership`).

    Args:
      lm: the frozen LM backend the generator uses.
      private_rows: the private examples (mappings with the fields `template.shot` reads).
      config: the generator's hyper-parameters; its noise is replaced per epsilon.
      template: the prompt layout.
      targets: the public targets of the extraction runs (one released text each).
      work_dir: the PRIVATE work folder: canary record, scores, released texts.
      epsilons: the runs; math.inf switches the noise off (not private).
      spec: the canaries (kinds must be ("secret",)); default 4 per cell at 1 and 10
        repetitions, 31 references.
      text_field: the shot field that holds a canary's `"<key> <secret>"`.
      pool_field: as in `fewshot.generate`; then `canary_fields` must put the canaries in
        `score_target`'s pool.
      canary_fields: the canary rows' other fields (e.g. a public document, a label).
      score_target: the target whose prompts score the canaries (default `targets[0]`).
      lead: what the generator releases before a shot's text field (" " after
        "Paragraph:" in `DOCUMENT_TEMPLATE`; "" for a stem that ends where the field starts).
      public_documents: public text for the keys' words (default a fixed word list).
      draws: Monte Carlo draws of the subsets per token (common to a canary's references).
      significance: the level of the epsilon lower bounds.
      out_dir: if set, `report.write_report` writes the aggregate report there.
      seed: tests only: fixes the canaries, the draws and the mechanisms' noise; default OS
        entropy.

    Returns:
      The audit record: aggregate figures only (no key, secret, text or per-canary score).

    Raises:
      ValueError: on bad arguments, a spec with other kinds, or canaries outside the pool.

    Privacy:
      Unit: one private example, add/remove-one (`fewshot.RELATION`); a canary repeated r
      times is r examples, claimed (r eps, r e^{(r-1) eps} delta) by group privacy. The
      secrets, in/out labels, per-canary scores and released texts stay in `work_dir`;
      the record holds aggregates and public plans. Runs are not charged: nothing is
      released but the aggregates, whose publication costs each run's epsilon (the
      epsilon = inf row is not private). Tang et al. 2024; Carlini et al. 2019.
    """
    from synthgen.audit import report

    spec = spec or canaries.CanarySpec(
        kinds=("secret",), repetitions=(1, 10), per_cell=4, references=31
    )
    if spec.kinds != ("secret",):
        raise ValueError(f"the few-shot audit uses digit-secret canaries only, got {spec.kinds=}")
    if not epsilons or any(not e > 0 for e in epsilons):
        raise ValueError(f"epsilons must be > 0 or inf, got {epsilons=}")
    if draws < 1 or not 0 < significance < 0.5:
        raise ValueError(f"need draws >= 1 and significance in (0, 0.5), got {draws=}")
    if not targets:
        raise ValueError("no targets to generate")
    canary_fields = dict(canary_fields or {})
    score_target = dict(score_target or targets[0])
    if pool_field is not None and canary_fields.get(pool_field) != score_target.get(pool_field):
        raise ValueError(f"canary_fields must put the canaries in score_target's {pool_field=}")
    work = private_folder(work_dir)

    canary_rng, reference_rng, draw_rng, generate_rng = secure_rng(seed).spawn(4)
    if (work / canaries.RECORD_FILE).is_file():
        drawn, record = canaries.load_record(work)
        references = record["references"]
    else:
        drawn = canaries.make_canaries(spec, list(public_documents), canary_rng)
        references = [
            [canaries.digit_secret(reference_rng) for _ in range(spec.references)] for _ in drawn
        ]
        canaries.save_record(
            drawn, work, references=references, spec=dataclasses.asdict(spec), generator="fewshot"
        )
    rows = list(private_rows) + canary_rows(drawn, text_field, canary_fields)
    runs = [run_plan(rows, targets, template, config, e, pool_field) for e in epsilons]

    scores_dir = private_folder(work / SCORES)
    ppl = score_canaries(
        lm,
        rows,
        drawn,
        references,
        template,
        score_target,
        runs,
        pool_field=pool_field,
        lead=lead,
        draws=draws,
        rng=draw_rng,
    )
    texts_dir = private_folder(work / TEXTS)
    results = []
    for epsilon, (run_config, plan), run_ppl, gen_rng in zip(
        epsilons, runs, ppl, generate_rng.spawn(len(runs)), strict=True
    ):
        tag = epsilon_tag(epsilon)
        released = fewshot.generate(
            lm, rows, targets, template, run_config, pool_field=pool_field, rng=gen_rng, plan=plan
        )
        (texts_dir / f"{tag}.json").write_text(json.dumps(released.texts))
        extracted = np.array([any(c.secret in t for t in released.texts) for c in drawn])
        prefixes = np.array([longest_prefix_found(c.secret, released.texts) for c in drawn])
        np.savez(
            scores_dir / f"{tag}.npz",
            log_perplexity=run_ppl,
            extracted=extracted,
            prefix_digits=prefixes,
        )
        members, rocs = _membership(drawn, run_ppl, plan, significance)
        results.append(
            {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "noise_multiplier": None if math.isinf(plan.epsilon) else plan.noise_multiplier,
                "token_epsilon": None if math.isinf(plan.epsilon) else plan.token_epsilon,
                "tokens_released": released.tokens_released,
                "cells": _cells(drawn, run_ppl, extracted, prefixes),
                "membership": members,
                "roc": rocs,
            }
        )
    audit = {
        "generator": "dp-few-shot-generator",
        "base": type(lm).__name__,
        "scored_distribution": (
            "P(released token) marginalised over subsample draws (Monte Carlo) and the "
            "mechanism's noise (exact); epsilon = inf: argmax of the mean"
        ),
        "config": {
            k: v
            for k, v in dataclasses.asdict(config).items()
            if k not in ("target_epsilon", "noise_multiplier", "token_epsilon")
        },
        "draws": draws,
        "private_examples": {"canary_copies": len(rows) - len(private_rows)},
        "canaries": canaries.summary(spec, drawn),
        "significance": significance,
        "runs": results,
    }
    if out_dir is not None:
        report.write_report(audit, out_dir)
    return audit
