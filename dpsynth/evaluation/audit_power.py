"""One config, one folder: the audits with power (`synthgen audit power`, `scripts/audit_power.py`).

A `PowerAuditConfig` names the audited generator and the cells, per claimed epsilon: the
white-box and black-box cells of the query generator
(`dpsynth.evaluation.querygen_audit_power`), and the one-run cells of the other generators
(`run_generators`): DP few-shot generation (`synthgen.audit.fewshot_release_audit`),
Private Evolution (`synthgen.audit.evolution_release_audit`) and DP-RAG answers
(`retriever.rag.one_run_audit`, via `rag_audit_power_cells`). `write_report` writes the
tables (one row per cell), ``roc.png``, ``histograms.png`` and ``power_audit.json`` (the
config and each cell's aggregates) into the results folder. A config file is YAML or JSON
with the fields of `PowerAuditConfig`; unknown fields are refused. See
docs/guides/audits.md.

Privacy:
  Everything written is aggregate: counts, rates, epsilons, TPR at 101 fixed FPRs and
  40-bin histograms (edges rounded outward) of each cell's in and out scores. No canary,
  coin or list of per-canary scores is written (the cells keep them in memory); with
  fewer than about 100 canaries a cell's ROC steps show the order of in and out labels by
  score, tied to no canary.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dpsynth.evaluation import querygen_audit_power
from synthgen.audit import blackbox, release_audit, whitebox
from synthgen.audit.claims import parse_epsilons
from synthgen.audit.report import strict_json
from synthgen.plots import pyplot

REPORT_FILE = "power_audit.json"
EPSILON_FIELDS = (
    "whitebox_epsilons",
    "blackbox_epsilons",
    "fewshot_epsilons",
    "evolution_epsilons",
    "rag_epsilons",
)
FEWSHOT_LM = "smollm2-135m-instruct"
# The measured few-shot cell: M = 1 prompt of 4 shots, one draw per text (the most copies a
# release can hold, `fewshot_release_audit`'s "Power"), 448 texts of 10 tokens, 100 ordinary rows.
FEWSHOT_SETTINGS = dict(
    num_private=100,
    num_texts=448,
    subsets=1,
    shots=4,
    shot_tokens=48,
    max_new_tokens=10,
    resample="example",
)
# The measured Private Evolution cell: one DP histogram (T = 1: the vote is the only
# private step; no LM variation), 2,200 released samples, 100 ordinary rows.
EVOLUTION_SETTINGS = dict(num_private=100, num_samples=2200, iterations=1)
ROC_PLOT = "roc.png"
HISTOGRAM_PLOT = "histograms.png"


@dataclasses.dataclass(frozen=True)
class PowerAuditConfig:
    """What one power audit runs (public).

    Attributes:
      model: the audited generator, one of `querygen_audit_power.MODELS`.
      canaries: m per cell (1,000 certifies up to about 4.7 at delta 1e-5).
      whitebox_epsilons, blackbox_epsilons: claimed epsilons of the white-box and black-box
        cells (inf: no noise).
      blackbox_kind: "new" (secrets of new vocabulary tokens) or "rare" (rarest tokens).
      blackbox_canaries, blackbox_epochs, blackbox_batch_size: m, epochs and expected batch
        of the black-box runs (None: `canaries`, the model's `querygen_audit_power.BLACKBOX`
        epochs, the preset's batch); a non-default epochs or batch is part of the file names.
      delta: delta of every claim and bound (the DP-RAG cells use the answer stage's
        per-document delta, `retriever.rag.one_run_audit.DELTA`, stated in their rows).
      fewshot_epsilons, evolution_epsilons, rag_epsilons: claimed epsilons of the few-shot
        (`FEWSHOT_SETTINGS`), Private Evolution (`EVOLUTION_SETTINGS`) and per-record DP-RAG
        cells (the entry point supplies the encoder and the DP-RAG runner).
      generator_canaries: m of those three kinds (None: `canaries`).
    """

    model: str = "demo_lora"
    canaries: int = 1000
    whitebox_epsilons: tuple[float, ...] = (math.inf, 8.0, 3.0, 1.0)
    blackbox_epsilons: tuple[float, ...] = (math.inf, 8.0)
    blackbox_kind: str = "new"
    blackbox_canaries: int | None = None
    blackbox_epochs: float | None = None
    blackbox_batch_size: int | None = None
    delta: float = 1e-5
    fewshot_epsilons: tuple[float, ...] = ()
    evolution_epsilons: tuple[float, ...] = ()
    rag_epsilons: tuple[float, ...] = ()
    generator_canaries: int | None = None

    def __post_init__(self) -> None:
        if self.model not in querygen_audit_power.MODELS:
            models = querygen_audit_power.MODELS
            raise ValueError(f"model must be one of {models}, got {self.model!r}")
        if self.blackbox_kind not in blackbox.KINDS:
            raise ValueError(f"blackbox_kind must be one of {blackbox.KINDS}")
        if min(self.canaries, self.blackbox_canaries or 2, self.generator_canaries or 2) < 2:
            raise ValueError("an audit needs at least 2 canaries per cell")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.blackbox_epochs is not None and not self.blackbox_epochs > 0:
            raise ValueError(f"blackbox_epochs must be > 0, got {self.blackbox_epochs}")
        batch = self.blackbox_batch_size
        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise ValueError(f"blackbox_batch_size must be an integer >= 1, got {batch!r}")


def _epsilons(value) -> tuple[float, ...]:
    if value in (None, "", []):
        return ()
    if isinstance(value, str):
        return parse_epsilons(value)
    return parse_epsilons(",".join(str(v) for v in value))


def load_config(path: str | Path) -> PowerAuditConfig:
    """A `PowerAuditConfig` from a YAML or JSON file.

    Raises:
      ValueError: not a mapping, an unknown field, or a bad value.
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text())  # JSON is YAML
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a power audit config is a mapping of fields")
    fields = {f.name for f in dataclasses.fields(PowerAuditConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; known: {sorted(fields)}")
    for name in EPSILON_FIELDS:
        if name in data:
            data[name] = _epsilons(data[name])
    return PowerAuditConfig(**data)


def run(
    config: PowerAuditConfig,
    out_dir: str | Path,
    *,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> tuple[list[whitebox.WhiteboxResult], list[blackbox.BlackboxResult]]:
    """Runs (or reads back: resumable per cell) every cell of `config` into `out_dir`."""

    def cells(run_cells: Callable[..., list], epsilons: tuple[float, ...], **options) -> list:
        if not epsilons:
            return []
        return run_cells(out_dir, config.model, epsilons, delta=config.delta, log=log, **options)

    qap = querygen_audit_power
    results = cells(
        qap.run_whitebox_cells, config.whitebox_epsilons, num_canaries=config.canaries, seed=seed
    )
    bb_results = cells(
        qap.run_blackbox_cells,
        config.blackbox_epsilons,
        kind=config.blackbox_kind,
        num_canaries=config.blackbox_canaries or config.canaries,
        epochs=config.blackbox_epochs,
        batch_size=config.blackbox_batch_size,
        seed=None if seed is None else seed + 1000,
    )
    return results, bb_results


Embed = Callable[[Sequence[str]], np.ndarray]
RagCells = Callable[..., list]


def run_generators(
    config: PowerAuditConfig,
    out_dir: str | Path,
    *,
    embed: Embed | None = None,
    rag_cells: RagCells | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> list[whitebox.CellResult]:
    """Runs (or reads back: resumable per cell) the few-shot, Private Evolution and DP-RAG
    cells of `config` into `out_dir`.

    Args:
      config: the audit; its `*_epsilons` fields name the cells.
      out_dir: the results folder (aggregates only).
      embed: the Private Evolution cells' encoder (texts -> [B, D]); required with
        `evolution_epsilons`.
      rag_cells: `dpsynth.evaluation.rag_audit_power_cells.demo_cells` (or a function of the same
        signature); required with `rag_epsilons`.
      seed: None (OS entropy) except in tests.
      log: progress lines (file names and seconds only).

    Raises:
      ValueError: a cell kind is asked for without what it needs.
    """
    from synthgen.audit import evolution_release_audit, fewshot_release_audit

    m = config.generator_canaries or config.canaries
    offset = lambda k: None if seed is None else seed + 2000 + 100 * k  # noqa: E731
    if config.evolution_epsilons and embed is None:
        raise ValueError("the Private Evolution cells need an encoder (embed=)")
    if config.rag_epsilons and rag_cells is None:
        raise ValueError(
            "the DP-RAG cells run from `synthgen audit power` or scripts/audit_power.py, "
            "which supply retriever's runner (rag_cells=)"
        )
    results: list[whitebox.CellResult] = []
    shared = dict(canaries=m, log=log, delta=config.delta)
    if config.fewshot_epsilons:
        from synthgen.lm_backends import FlaxLM

        to_run = any(
            not release_audit.cell_path(out_dir, "fewshot_power", "smollm2", m, eps).exists()
            for eps in config.fewshot_epsilons
        )
        results += fewshot_release_audit.run_fewshot_power_cells(
            out_dir,
            FlaxLM.load(FEWSHOT_LM) if to_run else None,  # every cell read back: no LM
            config.fewshot_epsilons,
            label="smollm2",
            seed=offset(0),
            model=FEWSHOT_LM,
            progress=True,
            **shared,
            **FEWSHOT_SETTINGS,
        )
    if config.evolution_epsilons:
        results += evolution_release_audit.run_evolution_power_cells(
            out_dir,
            None,
            config.evolution_epsilons,
            label="minilm_t1",
            seed=offset(1),
            embed=embed,
            model="none (T = 1, no LM call)",
            encoder="all-minilm-l6-v2",
            **shared,
            **EVOLUTION_SETTINGS,
        )
    if config.rag_epsilons:
        results += rag_cells(out_dir, config.rag_epsilons, canaries=m, seed=offset(2), log=log)
    return results


def format_generators_table(results: Sequence[whitebox.CellResult]) -> str:
    """A Markdown table of the few-shot, Private Evolution and DP-RAG cells."""
    head = (
        "| audit | claimed ε (δ) | canaries in/out | AUROC | TPR at 1% FPR "
        "| ε lower bound (ε-count / f-DP) | cap (ε-count / f-DP) | bound ≤ claim |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.primary
        claim = "∞" if math.isinf(r.claimed_epsilon) else f"{r.claimed_epsilon:.2f}"
        lines.append(
            f"| {_kind(r)} | {claim} ({r.delta:.0e}) | {r.num_in}/{r.num_out} "
            f"| {s.auroc:.3f} | {s.tpr_at_1pct_fpr:.3f} "
            f"| {s.epsilon_one_run:.2f} / {s.epsilon_one_run_fdp:.2f} "
            f"| {r.cap_one_run:.2f} / {r.cap_fdp:.2f} | {'NO' if r.violation else 'yes'} |"
        )
    return "\n".join(lines)


def _kind(result) -> str:
    """The audit a cell belongs to, in words (result classes may name it in `AUDIT`)."""
    if isinstance(result, blackbox.BlackboxResult):
        return f"black-box ({result.kind}, {result.epochs:g} ep, batch {result.batch_size})"
    return getattr(type(result), "AUDIT", "white-box")


def violations(cells: Sequence[whitebox.CellResult]) -> list[str]:
    """One line per cell whose bound exceeds its claim: a privacy defect to report and fix
    (either analysis at its own 95% level, so a sound run alarms at most ~10% of cells)."""
    return [
        f"PRIVACY VIOLATION: {_label(r)}: bound "
        f"{max(r.primary.epsilon_one_run, r.primary.epsilon_one_run_fdp):.2f} "
        f"> claim {r.claimed_epsilon:.2f}"
        for r in cells
        if r.violation
    ]


def _label(result) -> str:
    eps = "∞" if math.isinf(result.claimed_epsilon) else f"{result.claimed_epsilon:.2g}"
    return f"{_kind(result)}, ε = {eps}"


def plot_roc(results: Sequence, path: Path) -> bool:
    """Every cell's ROC curve, linear and log-log; False when no cell recorded one."""
    plt = pyplot()

    cells = [r for r in results if r.primary.roc_tpr]
    if not cells:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    # One line style per audit, one colour per cell within it (cells run in epsilon order, so
    # a colour means the same target epsilon in every audit).
    kinds = list(dict.fromkeys(_kind(r) for r in cells))
    seen: dict[str, int] = {}
    for r in cells:
        kind = _kind(r)
        rank = seen[kind] = seen.get(kind, -1) + 1
        style = dict(
            ls=("-", "--", ":", "-.")[kinds.index(kind) % 4], color=f"C{rank % 10}", lw=1.3
        )
        label = f"{_label(r)} (AUROC {r.primary.auroc:.2f})"
        for ax in axes:
            ax.plot(
                whitebox.ROC_FPR, r.primary.roc_tpr, label=label, drawstyle="steps-post", **style
            )
    for ax in axes:
        ax.plot([1e-3, 1], [1e-3, 1], color="grey", lw=0.8, ls="--", label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
    axes[0].set(xlim=(0, 1), ylim=(0, 1.01), title="ROC of the canary scores")
    axes[1].set(xscale="log", yscale="log", xlim=(0.01, 1), ylim=(1e-3, 1.05))
    axes[1].set_title("the same, low FPR (log-log)")
    if len(cells) > 6:  # beside the plots, where it hides no curve
        axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        fig.set_size_inches(14, 4.2)
    else:
        axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_histograms(results: Sequence, path: Path) -> bool:
    """Each cell's in and out canary scores, binned; False when no cell recorded them."""
    plt = pyplot()

    cells = [r for r in results if r.primary.histogram_edges]
    if not cells:
        return False
    cols = min(4, len(cells))
    rows = -(-len(cells) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, r in zip(axes.flat, cells, strict=False):
        s = r.primary
        edges = np.asarray(s.histogram_edges)
        ax.stairs(s.histogram_out, edges, label=f"out ({r.num_out})", color="tab:blue")
        ax.stairs(s.histogram_in, edges, label=f"in ({r.num_in})", color="tab:red")
        ax.set_title(f"{_label(r)}\nε lower bound {s.epsilon_one_run:.2f}", fontsize=8)
        ax.set_xlabel(f"score ({s.observable})", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(cells) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("canaries")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(
    config: PowerAuditConfig,
    results: Sequence[whitebox.WhiteboxResult],
    bb_results: Sequence[blackbox.BlackboxResult],
    out_dir: str | Path,
    generator_results: Sequence[whitebox.CellResult] = (),
) -> list[Path]:
    """Writes the tables, the plots and `REPORT_FILE` into `out_dir`; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if results:
        written.append(out / "whitebox_table.md")
        written[-1].write_text(querygen_audit_power.format_table(results) + "\n")
    if bb_results:
        written.append(out / "blackbox_table.md")
        written[-1].write_text(querygen_audit_power.format_blackbox_table(bb_results) + "\n")
    if generator_results:
        written.append(out / "generators_table.md")
        written[-1].write_text(format_generators_table(generator_results) + "\n")
    cells = [*results, *bb_results, *generator_results]
    if plot_roc(cells, out / ROC_PLOT):
        written.append(out / ROC_PLOT)
    if plot_histograms(cells, out / HISTOGRAM_PLOT):
        written.append(out / HISTOGRAM_PLOT)
    report = {
        "config": dataclasses.asdict(config),
        "whitebox": [r.to_dict() for r in results],
        "blackbox": [r.to_dict() for r in bb_results],
        "generators": [{"audit": _kind(r), **r.to_dict()} for r in generator_results],
        "summary": querygen_audit_power.summary_line(results, bb_results),
    }
    written.append(out / REPORT_FILE)
    written[-1].write_text(json.dumps(strict_json(report), indent=1, allow_nan=False))
    return written
