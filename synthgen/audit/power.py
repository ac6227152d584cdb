"""The audit-power table (issue 52): which audits can see a leak, cell by cell, resumable.

`scripts/audit_power.py` is its entry point. Today it runs the white-box cells
(`synthgen.audit.whitebox`): one DP step of a real query generator of the project with m
canary gradients, per claimed epsilon (inf = no noise, 8, 3, 1). The black-box cells (canary
pairs scored on the trained generator) are not run yet: their keys print as `nan`.

Models (the trainable parameters of a project generator, on a real batch of the wiki
summaries corpus, the demo's data):

  * `tiny_t5`: the `tiny_t5` query-generator preset, a random-init T5 "tiny" with a
    512-piece SentencePiece vocabulary trained on the corpus's documents; full fine-tuning.
  * `demo_lora`: the `smollm2_lora_cpu` preset (the CPU demo), LoRA rank 8 on SmolLM2-135M.

Every cell writes `whitebox_<model>_m<m>_eps<tag>.json` (aggregates only) into the output
folder; a cell whose file exists is read back instead of run, so an interrupted run resumes.

Privacy:
  The audited steps run on a batch of the (public) wiki summaries corpus standing in for
  private pairs; the files hold `WhiteboxResult` aggregates only: no coins, keys or scores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from synthgen.audit import whitebox
from synthgen.audit.claims import epsilon_tag

MODELS = ("tiny_t5", "demo_lora")
PRESETS = {"tiny_t5": "tiny_t5", "demo_lora": "smollm2_lora_cpu"}


@dataclasses.dataclass(frozen=True)
class AuditedModel:
    """A generator's loss, parameters and one real batch, as `dp_train.train` would take them."""

    name: str
    description: str
    loss_fn: Callable
    tapped_loss_fn: Callable | None
    trainable: Any
    frozen: Any
    batch: dict[str, np.ndarray]
    lora: bool
    clip_norm: float
    learning_rate: float
    microbatch: int

    @property
    def batch_size(self) -> int:
        return len(next(iter(self.batch.values())))


def load_model(name: str) -> AuditedModel:
    """Builds the named generator (`MODELS`) and its real batch of the preset's batch size.

    Raises:
      ValueError: an unknown name.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    from synthgen import querygen
    from synthgen.configs import querygen as presets
    from synthgen.corpora import load_wiki_summaries
    from synthgen.generator_models import split_trainable

    config = presets.get(PRESETS[name])
    pairs = load_wiki_summaries()
    batch_size = config.dp.batch_size
    with tempfile.TemporaryDirectory() as tokenizer_dir:  # a public vocabulary, discarded
        family, params = querygen.load_base(
            config, pairs["document"], tokenizer_dir=Path(tokenizer_dir), seed=0
        )
    rows = pairs.select(range(batch_size))
    batch = family.encode_pairs(
        rows["document"], rows["query"], config.input_len, config.target_len
    )
    lora = config.lora_rank > 0
    trainable, frozen = split_trainable(params, lora=lora)
    return AuditedModel(
        name=name,
        description=f"{PRESETS[name]} ({config.family} {config.base}, LoRA {config.lora_rank})",
        loss_fn=family.loss_fn(),
        tapped_loss_fn=family.tapped_loss_fn(),
        trainable=trainable,
        frozen=frozen,
        batch=batch,
        lora=lora,
        clip_norm=config.dp.clip_norm,
        learning_rate=config.dp.learning_rate,
        microbatch=config.dp.microbatch,
    )


def cell_path(out_dir: str | Path, model: str, num_canaries: int, epsilon: float) -> Path:
    return Path(out_dir) / f"whitebox_{model}_m{num_canaries}_eps{epsilon_tag(epsilon)}.json"


def run_whitebox_cells(
    out_dir: str | Path,
    model: str,
    epsilons: Sequence[float],
    *,
    num_canaries: int = 1000,
    delta: float = 1e-5,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> list[whitebox.WhiteboxResult]:
    """Runs (or reads back) one white-box cell per epsilon for `model`; resumable.

    Args:
      out_dir: the results folder (aggregates only); created if needed.
      model: one of `MODELS`.
      epsilons: target epsilons; `math.inf` is the non-private cell.
      num_canaries: m per cell.
      delta: delta of every claim and bound.
      seed: None (OS entropy) except in tests; cell k uses seed + k.
      log: progress lines (counts and epsilons only).

    Returns:
      One `WhiteboxResult` per epsilon, in order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: list[whitebox.WhiteboxResult] = []
    loaded: AuditedModel | None = None
    grad_sum = None
    for k, epsilon in enumerate(epsilons):
        path = cell_path(out, model, num_canaries, epsilon)
        if path.exists():
            results.append(whitebox.WhiteboxResult.from_dict(json.loads(path.read_text())))
            log(f"{path.name}: exists, skipped")
            continue
        if loaded is None:
            loaded = load_model(model)
            grad_sum = whitebox.clipped_batch_sum(
                loaded.loss_fn,
                loaded.trainable,
                loaded.frozen,
                loaded.batch,
                clip_norm=loaded.clip_norm,
                microbatch=loaded.microbatch,
                tapped_loss_fn=loaded.tapped_loss_fn,
            )
        config = whitebox.WhiteboxConfig(
            num_canaries=num_canaries,
            epsilon=epsilon,
            delta=delta,
            clip_norm=loaded.clip_norm,
            learning_rate=loaded.learning_rate,
            lora=loaded.lora,
            microbatch=loaded.microbatch,
            seed=None if seed is None else seed + k,
        )
        result = whitebox.audit_dp_step(
            grad_sum, loaded.trainable, loaded.batch_size, config, model=loaded.description
        )
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=1))
        tmp.replace(path)
        log(f"{path.name}: {result.seconds:.1f} s")
        results.append(result)
    return results


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


def format_table(results: Sequence[whitebox.WhiteboxResult]) -> str:
    """A Markdown table: one row per (cell, observable)."""
    head = (
        "| model | params | claimed eps | sigma | canaries in/out | observable | AUROC | "
        "TPR@1%FPR | eps one-run (count) | eps one-run (f-DP) | cap (count / f-DP) | ok |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        for s in r.stats:
            lines.append(
                f"| {r.model.split(' ')[0]} | {r.num_params:,} | {_fmt(r.claimed_epsilon)} | "
                f"{r.noise_multiplier:.3f} | {r.num_in}/{r.num_out} | {s.observable} | "
                f"{s.auroc:.3f} | {s.tpr_at_1pct_fpr:.3f} | {s.epsilon_one_run:.2f} | "
                f"{s.epsilon_one_run_fdp:.2f} | {r.cap_one_run:.2f} / {r.cap_fdp:.2f} | "
                f"{'VIOLATION' if r.violation else 'yes'} |"
            )
    return "\n".join(lines)


def summary_line(results: Sequence[whitebox.WhiteboxResult]) -> str:
    """The issue's last line; white-box keys from the primary observable's count bound.

    The black-box keys are `nan` (not run yet); `cap` is the epsilon-count cap of the
    non-private cell's canaries (the analysis of the `*_eps_lb` keys).
    """

    def find(target: float) -> whitebox.WhiteboxResult | None:
        return next((r for r in results if r.target_epsilon == target), None)

    nonprivate, dp8 = find(math.inf), find(8.0)
    value = lambda r: "nan" if r is None else f"{r.primary.epsilon_one_run:.4f}"  # noqa: E731
    cap = next((r for r in (nonprivate, dp8) if r is not None), None)
    return (
        f"nonprivate_eps_lb=nan dp8_eps_lb=nan whitebox_nonprivate_eps_lb={value(nonprivate)} "
        f"whitebox_dp8_eps_lb={value(dp8)} cap={'nan' if cap is None else f'{cap.cap_one_run:.4f}'}"
    )
