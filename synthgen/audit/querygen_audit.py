"""`synthgen audit run` for the DP query generator: train with canaries, score, audit.

For each epsilon (math.inf = a non-private run: clipping, no noise) the generator is trained
by `querygen.train_generator` on the private pairs plus the included canaries; every canary
is scored with its references (exposure and extraction per (kind, repetitions) cell) and by
membership inference per repetitions group, the score being the base model's
log-perplexity minus the trained model's (Carlini et al. 2022; Panda et al. 2025). A group
of r repetitions is judged against its group-privacy claim (`claims.group_claim`).

Privacy:
  The audit trains on the private pairs. Its models, the canary record (secrets, in/out
  labels), the per-canary scores and the training runs' secret state stay in the private
  work folder; the report folder gets aggregate figures only (per cell and group: medians,
  rates, AUC, TPR, epsilon bounds), computed from every trained model. With a payer
  (`pay`), the audit is one release of the pairs: `AuditRunsPlan`, the composition of its
  runs' DP-SGD events, is charged once before the first run trains, and an epsilon = inf
  run is refused (it is not private). Without one nothing is charged: for public pairs, or
  evaluations whose report is never published.

References: Carranza et al. 2023, Table 7; Carlini et al. 2019; Steinke, Nasr, Jagielski
2023; Panda et al. 2025.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import datasets
import jax
import numpy as np
from dp_accounting import dp_event

from synthgen import querygen
from synthgen.audit import auditor, canaries, exposure
from synthgen.audit.claims import epsilon_tag
from synthgen.dp_plan import PrivacyPlan
from synthgen.privacy import accountants
from synthgen.privacy.receipts import Payer, paid
from synthgen.privacy.rng import secure_rng
from synthgen.work_folder import check_apart, private_folder

SCORES = "scores"
MODELS = "models"


def run_config(config: querygen.GeneratorConfig, epsilon: float, seed: int | None):
    """The generator config of the audit run at `epsilon` (inf: noise multiplier 0)."""
    if math.isinf(epsilon):
        changes = dict(dp_noise_multiplier=0.0, dp_target_epsilon=None)
    else:
        changes = dict(dp_noise_multiplier=None, dp_target_epsilon=epsilon)
    return config.replace(dp_seed=seed, **changes)


def planned_size(spec: canaries.CanarySpec, num_pairs: int) -> int:
    """The training set every run is planned for: the pairs and every canary's copies, in
    or out (a public size fixed before the in/out draw)."""
    copies = sum(spec.cell_size(r) * r for r in spec.repetitions) * len(spec.kinds)
    return num_pairs + copies


@dataclasses.dataclass(frozen=True)
class AuditRunsPlan:
    """The audit's finite-epsilon runs on the private pairs as one release: their DP-SGD
    events composed with the runs' accountant, stated at the sum of their deltas
    (`audit_runs_plan`)."""

    runs: tuple[PrivacyPlan, ...]
    epsilon: float
    delta: float

    @property
    def relation(self):
        return self.runs[0].relation

    @property
    def event(self) -> dp_event.DpEvent:
        return dp_event.ComposedDpEvent([run.event for run in self.runs])

    def to_dict(self, exclude_runs: bool = False) -> dict:
        stated = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "neighboring_relation": self.relation.name,
            "accountant": self.runs[0].accountant,
        }
        return stated if exclude_runs else {**stated, "runs": [r.to_dict() for r in self.runs]}


def audit_runs_plan(
    config: querygen.GeneratorConfig,
    epsilons: Sequence[float],
    size: int,
    seed: int | None = None,
) -> AuditRunsPlan:
    """The plan charged for the audit's runs at `epsilons` (all finite), each planned for
    `size` training examples (`planned_size`).

    Raises:
      ValueError: no epsilon, or an infinite one (a non-private run cannot be charged).
    """
    if not epsilons or not all(math.isfinite(e) for e in epsilons):
        raise ValueError(
            f"a charged audit runs finite epsilons only (inf is not private), got {epsilons=}"
        )
    if config.dp.sampling != "poisson":
        raise ValueError("the audit's runs are planned at a fixed Poisson rate: sampling='poisson'")
    runs = tuple(
        querygen.dp_train.plan_privacy(run_config(config, e, seed).dp, size) for e in epsilons
    )
    if len({(run.relation, run.accountant) for run in runs}) != 1:
        raise ValueError("the audit's runs are stated under different relations or accountants")
    delta = sum(run.delta for run in runs)
    event = dp_event.ComposedDpEvent([run.event for run in runs])
    epsilon = accountants.epsilon(
        event, delta, accountant=runs[0].accountant, relation=runs[0].relation
    )
    return AuditRunsPlan(runs, epsilon, delta)


def _first_token_log_probs(family, params, input_len: int, target_len: int) -> np.ndarray:
    """The base model's log-probabilities of the first query token after an empty document."""
    data = family.encode_pairs([""], ["x"], input_len, target_len)
    ex = {k: v[0] for k, v in data.items()}
    logits = family.logits_fn()(params, ex)[0]
    return np.asarray(jax.nn.log_softmax(logits.astype(np.float32)))


def _secret_start(tokenizer, canary: canaries.Canary) -> int:
    key = tokenizer.encode(canary.key)
    return len(key) if tokenizer.encode(canary.query)[: len(key)] == key else 0


def check_fingerprint(work: Path, config, spec: canaries.CanarySpec, num_pairs: int) -> None:
    """Refuses to resume a work folder made with another config, spec or dataset size."""
    import hashlib

    text = json.dumps(
        [dataclasses.asdict(config.replace(dp_seed=None)), dataclasses.asdict(spec), num_pairs],
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = work / "fingerprint.txt"
    if path.is_file() and path.read_text() != digest:
        raise ValueError(
            f"{work} holds an audit of another config, canary spec or dataset: "
            "use a new --work-dir (or delete that one)"
        )
    path.write_text(digest)


def check_lengths(tokenizer, drawn, references, target_len: int) -> None:
    """Refuses canaries whose queries would be cut at `target_len` tokens (before training)."""
    longest = max(
        len(tokenizer.encode(c.with_secret(s))) + 1
        for c, refs in zip(drawn, references, strict=True)
        for s in [c.secret, *refs]
    )
    if longest > target_len:
        raise ValueError(f"canary queries need {longest} tokens > {target_len=}: raise target_len")


def prepare(
    config: querygen.GeneratorConfig,
    pairs: datasets.Dataset,
    work: Path,
    spec: canaries.CanarySpec,
    *,
    document_field: str,
    query_field: str,
    seed: int | None,
    score_batch: int = 16,
    progress: bool = False,
) -> tuple[list[canaries.Canary], dict]:
    """Draws (or reloads) the canaries, their references and their base-model scores.

    The base model is loaded as `train_generator` will load it (a random-init vocabulary
    is trained on the same documents), so the rare-token pool, the length check and the
    calibration scores use the tokenizer the audited generators train with.

    Returns:
      (canaries, record): the record holds the references, the rare-token pool and the
      base log-perplexities ("base_log_perplexity"), all private to the work folder.
    """
    if (work / canaries.RECORD_FILE).is_file():
        return canaries.load_record(work)
    rng = secure_rng(seed)
    drawn = canaries.make_canaries(spec, list(pairs[document_field]), rng)
    family, params = querygen.load_base(config, tokenizer_dir=work / "base_tokenizer", seed=0)
    pool: list[int] = []
    if "rare_token" in spec.kinds:
        log_probs = _first_token_log_probs(family, params, config.input_len, config.target_len)
        pool = canaries.rare_token_pool(family.tokenizer, log_probs, spec.rare_pool)
        drawn = canaries.with_rare_secrets(drawn, rng, family.tokenizer, pool)
    references = [
        [canaries.reference_secret(c, rng, family.tokenizer, pool) for _ in range(spec.references)]
        for c in drawn
    ]
    check_lengths(family.tokenizer, drawn, references, config.target_len)
    base = exposure.score_sequences(  # the calibration: the canaries under the base model
        family,
        params,
        [c.document for c in drawn],
        [c.query for c in drawn],
        input_len=config.input_len,
        target_len=config.target_len,
        batch_size=score_batch,
        progress=progress,
        description="score base",
    ).log_perplexity
    canaries.save_record(
        drawn,
        work,
        references=references,
        rare_pool=pool,
        base_log_perplexity=base.tolist(),
        spec=dataclasses.asdict(spec),
        num_private_pairs=len(pairs),
    )
    return canaries.load_record(work)


def training_set(
    pairs: datasets.Dataset, drawn: Sequence[canaries.Canary], document_field: str, query_field: str
) -> datasets.Dataset:
    """The private pairs followed by the included canaries (order does not matter: Poisson)."""
    documents, queries = canaries.insertions(drawn)
    return datasets.Dataset.from_dict(
        {
            "document": list(pairs[document_field]) + documents,
            "query": list(pairs[query_field]) + queries,
        }
    )


def score_model(
    family, params, drawn, references, *, input_len: int, target_len: int, batch: int, progress
) -> dict[str, np.ndarray]:
    """Log-perplexities (bits) of every canary (column 0) and its references; greedy hits."""
    width = 1 + len(references[0])
    documents, queries, starts = [], [], []
    for canary, refs in zip(drawn, references, strict=True):
        start = _secret_start(family.tokenizer, canary)
        documents += [canary.document] * width
        queries += [canary.query] + [canary.with_secret(r) for r in refs]
        starts += [start] * width
    scores = exposure.score_sequences(
        family,
        params,
        documents,
        queries,
        secret_start=starts,
        input_len=input_len,
        target_len=target_len,
        batch_size=batch,
        progress=progress,
    )
    return {
        "log_perplexity": scores.log_perplexity.reshape(len(drawn), width),
        "greedy": scores.greedy_secret.reshape(len(drawn), width)[:, 0],
    }


def cell_figures(drawn, scores: dict, base_ppl: np.ndarray, pool_size: int) -> list[dict]:
    """Exposure and extraction per (kind, repetitions, included) cell."""
    ppl = scores["log_perplexity"]
    return [
        {
            "kind": kind,
            "repetitions": reps,
            "included": included,
            **exposure.group_figures(
                ppl, idx, [canaries.space_size(drawn[i], pool_size) for i in idx]
            ),
            "extracted": float(np.mean(scores["greedy"][idx])),
            "median_log_perplexity_drop": float(np.median(base_ppl[idx] - ppl[idx, 0])),
        }
        for (reps, kind), included, idx in canaries.in_out_groups(
            drawn, lambda c: (c.repetitions, c.kind)
        )
    ]


def membership_figures(
    drawn, scores: dict, base_ppl: np.ndarray, epsilon: float, delta: float, significance: float
) -> tuple[list[dict], dict]:
    """Membership audit per repetitions group; returns (rows, ROC points per group)."""

    def figures(inside, outside, claim_eps, claim_delta) -> dict:
        result = auditor.audit(
            inside,
            outside,
            claimed_epsilon=claim_eps,
            delta=claim_delta,
            significance=significance,
        )
        return {**result.to_dict(), "violation_message": auditor.violation_message(result)}

    membership = base_ppl - scores["log_perplexity"][:, 0]  # higher: more likely inserted
    return auditor.membership_rows(drawn, membership, epsilon, delta, figures)


def run_querygen_audit(
    config: querygen.GeneratorConfig,
    pairs: datasets.Dataset,
    out_dir: str | Path,
    *,
    epsilons: Sequence[float],
    spec: canaries.CanarySpec,
    work_dir: str | Path,
    document_field: str = "document",
    query_field: str = "query",
    significance: float = 0.05,
    score_batch: int = 16,
    seed: int | None = None,
    progress: bool = True,
    pay: Payer | None = None,
    plan: AuditRunsPlan | None = None,
) -> dict:
    """Trains the generator with canaries at each epsilon, scores them, writes the report.

    Resumable: the canaries, each trained model and each model's scores are kept in the
    private `work_dir`; calling again with the same folders skips what is done.

    Args:
      config: the generator configuration to audit (its epsilon is replaced per run).
      pairs: the private training pairs.
      out_dir: the report folder (aggregate figures and plots only).
      epsilons: the runs; math.inf is a non-private run.
      spec: the canaries to insert.
      work_dir: the PRIVATE work folder (models, canary record, scores, training state).
      seed: tests only: fixes the canaries and every run's noise; default OS entropy.
      pay: the payer of the pairs' scope (`AuditRunsPlan`, charged once before the first
        run trains; a resumed audit pays nothing more when the payer is a work folder's),
        or None: nothing charged.
      plan: with `pay`, the caller's `audit_runs_plan` of these settings (computed once:
        each run's noise calibration is the audit's costliest setup); default: computed here.

    Returns:
      The audit record written to `out_dir/audit.json`.

    Raises:
      ValueError: bad settings, overlapping folders, or an infinite epsilon with a payer.
    """
    from tqdm.auto import tqdm

    from synthgen.audit import report

    if not 0 < significance < 0.5:
        raise ValueError(f"significance must be in (0, 0.5), got {significance=}")
    check_apart(out_dir, work_dir, "report")
    if pay is None:
        plan = None
    elif plan is None:
        plan = audit_runs_plan(config, epsilons, planned_size(spec, len(pairs)), seed)
    elif len(plan.runs) != len(epsilons) or not all(map(math.isfinite, epsilons)):
        raise ValueError(f"a charged plan of {len(plan.runs)} runs for epsilons {epsilons}")
    elif any(r.num_examples != planned_size(spec, len(pairs)) for r in plan.runs):
        raise ValueError("the plan's runs are planned for another number of examples")
    run_plans = {} if plan is None else dict(zip(epsilons, plan.runs, strict=True))
    work = private_folder(Path(work_dir))
    check_fingerprint(work, config, spec, len(pairs))
    drawn, record = prepare(
        config,
        pairs,
        work,
        spec,
        document_field=document_field,
        query_field=query_field,
        seed=seed,
        score_batch=score_batch,
        progress=progress,
    )
    references = record["references"]
    pool_size = max(len(record["rare_pool"]), 1)
    base_ppl = np.asarray(record["base_log_perplexity"])
    train = training_set(pairs, drawn, document_field, query_field)
    size = len(pairs) + sum(c.repetitions for c in drawn)
    if size != planned_size(spec, len(pairs)):
        raise AssertionError(f"{size=} is not the planned {planned_size(spec, len(pairs))}")
    if plan is not None:  # the runs' own checks first: a refusal after the charge wastes it
        querygen._check_pairs(train, document_field, query_field)  # noqa: SLF001
        paid(pay, plan, f"canary audit of the query generator at epsilons {list(epsilons)}")
    sizes = dict(input_len=config.input_len, target_len=config.target_len, batch=score_batch)
    runs = []
    for epsilon in tqdm(epsilons, desc="audit runs", unit="run", disable=not progress):
        tag = epsilon_tag(epsilon)
        model_dir = work / MODELS / tag
        if not (model_dir / querygen.GENERATOR_FILE).is_file():
            cfg = run_config(config, epsilon, seed)
            # The plan is made for every canary inserted (a public size fixed before the
            # in/out draw): rate, steps, sigma and delta do not depend on the draw.
            run_plan = run_plans.get(epsilon) or querygen.dp_train.plan_privacy(cfg.dp, size)
            querygen.train_generator(
                cfg,
                train,
                model_dir,
                work_dir=work / "train" / tag,
                progress=progress,
                plan=run_plan,
                fixed_rate=True,
                # charged once: a finished run keeps its seed and state, so training it
                # again (its model deleted) repeats the same draw, never a fresh one
                keep_work=plan is not None,
            )
        score_file = private_folder(work / SCORES) / f"{tag}.npz"
        if not score_file.is_file():
            family, params, _ = querygen.load_generator(model_dir)
            scored = score_model(family, params, drawn, references, progress=progress, **sizes)
            np.savez(score_file, **scored)
        scores = dict(np.load(score_file))
        privacy = json.loads((model_dir / querygen.GENERATOR_FILE).read_text())["privacy"]
        claimed = math.inf if not privacy.get("private", True) else float(privacy["epsilon"])
        delta = float(privacy["delta"])
        members, rocs = membership_figures(drawn, scores, base_ppl, claimed, delta, significance)
        runs.append(
            {
                "epsilon": claimed,
                "delta": delta,
                "noise_multiplier": privacy["noise_multiplier"],
                "steps": privacy["steps"],
                "cells": cell_figures(drawn, scores, base_ppl, pool_size),
                "membership": members,
                "roc": rocs,
            }
        )
    audit = {
        "generator": "dp-query-generator",
        "family": config.family,
        "base": config.base,
        "lora_rank": config.lora_rank,
        "training_examples": {
            "private_pairs": len(pairs),
            "canary_copies": len(train) - len(pairs),
        },
        "canaries": canaries.summary(spec, drawn),
        "significance": significance,
        # what the pairs paid: the runs composed (each run's own epsilon is its claim above)
        "charged": None if plan is None else plan.to_dict(exclude_runs=True),
        "runs": runs,
    }
    report.write_report(audit, out_dir)
    return audit
