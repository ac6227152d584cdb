"""The audit's report folder: audit.json, audit.md and PNG plots (aggregate figures only).

Privacy:
  Nothing per canary reaches this folder: no secret, no in/out label, no per-canary score;
  only per-cell medians and rates, and per-group membership figures and ROC curves.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from synthgen.plots import pyplot

AUDIT_FILE = "audit.json"
TABLE_FILE = "audit.md"
EXPOSURE_PLOT = "exposure.png"
ROC_PLOT = "roc.png"


def _eps(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3g}"


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}"


def _charged(charged: dict | None) -> list[str]:
    """The line that states what an audit of private pairs charged (none for public pairs)."""
    if charged is None:
        return []
    return [
        f"Charged once to the pairs' ledger: every run below composed, ε = "
        f"{charged['epsilon']:.3g} at δ = {charged['delta']:.3g} "
        f"({charged['neighboring_relation']}; the ledger states it at its scope's δ cap); each "
        "run's own ε is the claim it is audited against.",
        "",
    ]


def markdown(audit: dict) -> str:
    """The exposure table and the membership table of an audit record."""
    lines = [
        f"# Privacy audit: {audit['generator']} ({audit.get('base', '')})",
        "",
        *_charged(audit.get("charged")),
        "## Exposure and extraction (canaries inserted vs. not inserted)",
        "",
        "| ε | kind | repetitions | median rank (in) | exposure in (bits) | "
        "extrapolated exposure in | extracted in | exposure out | extracted out |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in audit["runs"]:
        cells = {(c["kind"], c["repetitions"], c["included"]): c for c in run["cells"]}
        for kind, reps in sorted({(k, r) for k, r, _ in cells}, key=lambda x: (x[1], x[0])):
            inside, outside = cells.get((kind, reps, True)), cells.get((kind, reps, False))
            ref = (inside or outside)["references"] + 1
            lines.append(
                f"| {_eps(run['epsilon'])} | {kind} | {reps} | "
                + (
                    f"{inside['median_rank']:g}/{ref} | {_fmt(inside['median_exposure'])} | "
                    f"{_fmt(inside['median_extrapolated_exposure'], 1)} | "
                    f"{inside['extracted']:.0%} | "
                    if inside
                    else "– | – | – | – | "
                )
                + (
                    f"{_fmt(outside['median_exposure'])} | {outside['extracted']:.0%} |"
                    if outside
                    else "– | – |"
                )
            )
    lines += [
        "",
        "## Membership inference and empirical ε lower bounds "
        f"(confidence {1 - audit['significance']:.0%})",
        "",
        "| ε | repetitions | claimed ε (group) | in/out | AUC | TPR @ 1% FPR | "
        "ε lower bound (one run) | ε lower bound (Clopper–Pearson) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in audit["runs"]:
        for row in run["membership"]:
            if "auroc" not in row:
                lines.append(
                    f"| {_eps(run['epsilon'])} | {row['repetitions']} | "
                    f"{_eps(row['claimed_epsilon'])} | – | – | – | – | – | {row['note']} |"
                )
                continue
            if row["violation"]:
                verdict = "**VIOLATION**"
            elif row.get("epsilon_one_run") is None:
                verdict = "descriptive only"
            elif math.isinf(row["claimed_epsilon"]):
                verdict = "no claim"
            else:
                verdict = "consistent"
            lines.append(
                f"| {_eps(run['epsilon'])} | {row['repetitions']} | "
                f"{_eps(row['claimed_epsilon'])} | {row['num_in']}/{row['num_out']} | "
                f"{_fmt(row['auroc'])} | {_fmt(row['tpr_at_1pct_fpr'])} | "
                f"{_fmt(row['epsilon_one_run'])} | {_fmt(row['epsilon_clopper_pearson'])} | "
                f"{verdict} |"
            )
    lines += [
        "",
        "Exposure = log2(#references) − log2(rank); the extrapolated exposure fits a "
        "skew-normal to the references (Carlini et al. 2019) and is capped at log2 of the "
        "secret space. 'Extracted': greedy decoding after the canary's key words reproduces "
        "the secret. A group of r repetitions is claimed (rε, r·e^{(r−1)ε}·δ)-DP by group "
        "privacy (∞ when that δ reaches 1). The one-run ε lower bound holds at the stated "
        "confidence because each canary was inserted independently with probability 1/2, "
        "and decides the verdict (a report of G groups: all right with probability ≥ 1 − "
        "G × significance); the Clopper–Pearson bound treats canaries as separate runs and is "
        "for information only.",
    ]
    if any(math.isinf(run["epsilon"]) for run in audit["runs"]):
        lines += [
            "",
            "**The ε = ∞ rows come from a NON-private model: they are not DP and must not be "
            "published outside the operators.**",
        ]
    return "\n".join(lines) + "\n"


def violations(audit: dict) -> list[str]:
    return [
        row["violation_message"]
        for run in audit["runs"]
        for row in run["membership"]
        if row.get("violation_message")
    ]


def plot_exposure(audit: dict, path: Path) -> None:
    plt = pyplot()

    kinds = sorted({c["kind"] for run in audit["runs"] for c in run["cells"]})
    fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for run in audit["runs"]:
            cells = sorted(
                (c for c in run["cells"] if c["kind"] == kind and c["included"]),
                key=lambda c: c["repetitions"],
            )
            if cells:
                ax.plot(
                    [c["repetitions"] for c in cells],
                    [c["median_exposure"] for c in cells],
                    marker="o",
                    label=f"ε = {_eps(run['epsilon'])}",
                )
        ax.set_xscale("log")
        ax.set_title(kind)
        ax.set_xlabel("repetitions")
        ax.set_ylabel("median exposure (bits)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Exposure of inserted canaries")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roc(audit: dict, path: Path) -> None:
    plt = pyplot()

    groups = sorted({int(r) for run in audit["runs"] for r in run["roc"]})
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.4), squeeze=False)
    for ax, reps in zip(axes[0], groups, strict=True):
        for run in audit["runs"]:
            roc = run["roc"].get(reps) or run["roc"].get(str(reps))
            if roc:
                ax.plot(roc["fpr"], roc["tpr"], label=f"ε = {_eps(run['epsilon'])}")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        ax.set_title(f"{reps} repetition(s)")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Membership inference ROC (base-calibrated log-perplexity)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def strict_json(value):
    """`value` with infinite floats written as the string "inf" (JSON has no infinity)."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def write_report(audit: dict, out_dir: str | Path) -> Path:
    """Writes audit.json, audit.md, exposure.png and roc.png; prints violations loudly."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / AUDIT_FILE).write_text(json.dumps(strict_json(audit), indent=1, allow_nan=False))
    (out / TABLE_FILE).write_text(markdown(audit))
    if any(run["cells"] for run in audit["runs"]):
        plot_exposure(audit, out / EXPOSURE_PLOT)
    plot_roc(audit, out / ROC_PLOT)
    for message in violations(audit):
        print(message, file=sys.stderr)
    return out
