"""`synthgen audit run`: the canary audit of the DP query generator (thin wrapper)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import admit_run, group_app
from dpsynth.cli.synthgen.common import (
    BudgetOption,
    DatasetOption,
    ExpectedBatchOption,
    PresetOption,
    SplitOption,
    preset_with,
)
from synthgen.command_line import GuaranteesAddUpOption, LedgerOption, TestSeedOption, choice

audit_app = group_app(
    "Empirical privacy audits: canaries, exposure, membership, epsilon lower bounds."
)


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty")
    return values


AUDIT_TENANT, AUDIT_STAGE = "audit", "querygen-audit"  # the charged audit's scope and stage
WIKI = "wiki-summaries-en"  # the public pairs asset
PairsArePublicOption = Annotated[
    bool,
    typer.Option(
        help="the --pairs file is public: nothing is charged and an inf run is allowed "
        "(otherwise the audit is a release of the pairs, charged before it trains)"
    ),
]
ReportOutOption = Annotated[
    Path, typer.Option(help="report folder: audit.json, audit.md, PNG plots")
]
PrivatePairsOption = Annotated[
    str,
    typer.Option(
        help="pairs: a JSONL file with document/query or a wiki-shaped file (private unless "
        "--pairs-are-public), or the public wiki-summaries-en asset"
    ),
]
EpsilonsOption = Annotated[
    str, typer.Option(help="comma-separated epsilons; inf = non-private run")
]
RepetitionsOption = Annotated[str, typer.Option(help="comma-separated repetition counts")]
PerCellOption = Annotated[
    str,
    typer.Option(
        help="canaries per (kind, repetitions) cell: one number, or one per repetition "
        "count (e.g. 16,4,1)"
    ),
]
KindsOption = Annotated[str, typer.Option(help="secret,real_document,random_document,rare_token")]
ReferencesOption = Annotated[int, typer.Option(help="reference secrets per canary")]
PrivateLimitOption = Annotated[int | None, typer.Option(help="first N private pairs only")]
EpochsOverrideOption = Annotated[float | None, typer.Option(help="override the preset's epochs")]
TargetLenOption = Annotated[int | None, typer.Option(help="query tokens (canaries need ~20)")]
SignificanceOption = Annotated[float, typer.Option(help="1 - confidence of the bounds")]
AuditWorkDirOption = Annotated[
    Path | None,
    typer.Option(
        help="PRIVATE work folder: canary record, models, scores, training state "
        "(default: beside the ledger, <ledger folder>/work/<out name>-<hash>; never ship it)"
    ),
]


def _canary_spec(kinds: str, repetitions: str, per_cell: str, references: int):
    """The `CanarySpec` of --kinds, --repetitions, --per-cell and --references."""
    from synthgen.audit import canaries

    reps = _ints(repetitions, "--repetitions")
    counts = _ints(per_cell, "--per-cell")
    if len(counts) not in (1, len(reps)):
        raise ValueError("--per-cell takes one number or one per repetition count")
    return canaries.CanarySpec(
        kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()),
        repetitions=reps,
        per_cell=counts[0] if len(counts) == 1 else dict(zip(reps, counts, strict=True)),
        references=references,
    )


def _work_folder(out: Path, work_dir: Path | None, ledger: str | None) -> Path:
    """--work-dir, else the default one beside the ledger's file; refused, before the pairs
    are admitted to the ledger, where it overlaps the report folder."""
    from synthgen.paths import default_work_dir
    from synthgen.work_folder import check_apart

    work = work_dir if work_dir is not None else default_work_dir(out, ledger)
    check_apart(out, work, "report")
    return work


def _audit_payer(pairs, rows, cfg, spec, epsilons, seed, work, ledger, dataset, **admission):
    """The payer of an audit of private pairs (tenant "audit", stage "querygen-audit"): the
    pairs bound, the scope opened and the composed runs' charge checked, before any
    compute; a charge made once across resumes (the work folder keeps its record). Returns
    (payer, the runs' plan)."""
    from synthgen.audit.querygen_audit import audit_runs_plan, planned_size
    from synthgen.work_folder import WorkFolder

    if any(e == float("inf") for e in epsilons):
        raise typer.BadParameter(
            "an inf run on private pairs is not private: drop it, or pass --pairs-are-public "
            "if the pairs are public",
            param_hint="'--epsilon'",
        )
    plan = audit_runs_plan(cfg, epsilons, planned_size(spec, len(rows)), seed)
    if plan.delta * len(rows) >= 1:
        raise typer.BadParameter(
            f"the runs' deltas add up to {plan.delta:.3g}, not below 1/n for n={len(rows)} "
            "pairs: audit fewer epsilons or lower the preset's delta",
            param_hint="'--epsilon'",
        )
    scope = (AUDIT_TENANT, dataset or Path(pairs).stem)
    records = [{"document": r["document"], "query": r["query"]} for r in rows]
    book = admit_run(
        ledger, scope, records, plan, stage=AUDIT_STAGE, public_count=len(rows), check=False,
        **admission,
    )  # fmt: skip
    payer = WorkFolder(Path(work) / "charge").payer(book, scope, stage=AUDIT_STAGE)
    payer.check(plan)
    return payer, plan


@audit_app.command("run")
def audit_run(
    out: ReportOutOption,
    pairs: PrivatePairsOption = WIKI,
    config: PresetOption = "tiny_llama",
    epsilon: EpsilonsOption = "inf,16,8,3",
    repetitions: RepetitionsOption = "1,10,100",
    per_cell: PerCellOption = "8",
    kinds: KindsOption = "secret,real_document,random_document,rare_token",
    references: ReferencesOption = 100,
    limit: PrivateLimitOption = None,
    split: SplitOption = "train",
    epochs: EpochsOverrideOption = None,
    batch_size: ExpectedBatchOption = None,
    learning_rate: float | None = None,
    target_len: TargetLenOption = None,
    significance: SignificanceOption = 0.05,
    work_dir: AuditWorkDirOption = None,
    seed: TestSeedOption = None,
    pairs_are_public: PairsArePublicOption = False,
    ledger: LedgerOption = None,
    dataset: DatasetOption = None,
    budget: BudgetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
) -> None:
    """Train the query generator with canaries at each epsilon, score them, write the report.

    Canaries of each (kind, repetitions) cell are inserted with probability 1/2. The report
    folder gets aggregate figures only; the canary record, the models and the per-canary
    scores stay in the private --work-dir. Re-running the same command resumes. A --pairs
    file is private unless --pairs-are-public: the audit is then one release of it, its
    runs' composed epsilon charged once before training (tenant "audit"), and an inf run is
    refused. The packaged wiki pairs are public: nothing is charged.
    """
    from synthgen.audit import querygen_audit
    from synthgen.audit.claims import parse_epsilons
    from synthgen.corpora import load_rows

    spec = _canary_spec(kinds, repetitions, per_cell, references)
    cfg = preset_with(
        config, {}, dp_epochs=epochs, dp_batch_size=batch_size, dp_learning_rate=learning_rate,
        target_len=target_len,
    )  # fmt: skip
    rows = load_rows(pairs, ("document", "query"), limit, split)
    work = _work_folder(out, work_dir, ledger)
    epsilons = parse_epsilons(epsilon)
    pay = plan = None  # public pairs: nothing charged
    # only the packaged wiki asset is public; any file or folder given is private
    if not pairs_are_public and (pairs != WIKI or Path(pairs).exists()):
        pay, plan = _audit_payer(pairs, rows, cfg, spec, epsilons, seed, work, ledger, dataset,
                           budget=budget, guarantees_add_up=guarantees_add_up)  # fmt: skip
    audit = querygen_audit.run_querygen_audit(
        cfg, rows, out, epsilons=epsilons, spec=spec, work_dir=work,
        significance=significance, seed=seed, pay=pay, plan=plan,
    )  # fmt: skip
    from synthgen.audit import report

    print(report.markdown(audit), file=sys.stderr)
    violations = len(report.violations(audit))
    print(json.dumps({"out": str(out), "work_dir": str(work), "violations": violations}))


@audit_app.command("power")
def audit_power(
    out: Annotated[Path, typer.Option(help="results folder: tables, roc.png, histograms.png")],
    config: Annotated[
        Path | None,
        typer.Option(
            help="YAML or JSON config: model, canaries, whitebox_epsilons, blackbox_epsilons, "
            "blackbox_kind, blackbox_canaries, delta, fewshot_epsilons, evolution_epsilons, "
            "rag_epsilons, generator_canaries (default: every field's default)"
        ),
    ] = None,
    model: Annotated[
        str | None,
        choice("tiny_t5", "demo_lora", help="override the config's audited generator"),
    ] = None,
) -> None:
    """Audits with power: 1,000 canaries per cell, one-run epsilon lower bounds at 95%.

    White-box cells insert canary gradients into one DP-SGD step; black-box cells fine-tune
    the generator with canaries whose secrets are new tokens and score the final model;
    few-shot, Private Evolution and DP-RAG cells plant canaries among the private examples
    (or records) and score the released text. Resumable per cell; the folder gets
    aggregates only (no canary, coin or score). The last line is the same key=value
    summary as scripts/audit_power.py.
    """
    import dataclasses

    from dpsynth.evaluation import audit_power, querygen_audit_power
    from dpsynth.evaluation.rag_audit_power_cells import generator_runners

    cfg = audit_power.load_config(config) if config is not None else audit_power.PowerAuditConfig()
    if model is not None:
        cfg = dataclasses.replace(cfg, model=model)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    results, bb_results = audit_power.run(cfg, out, log=log)
    generators = audit_power.run_generators(cfg, out, log=log, **generator_runners(cfg))
    for path in audit_power.write_report(cfg, results, bb_results, out, generators):
        print(f"wrote {path}", file=sys.stderr)
    for line in audit_power.violations([*results, *bb_results, *generators]):
        print(line, file=sys.stderr)
    print(querygen_audit_power.summary_line(results, bb_results))
