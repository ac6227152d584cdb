"""The audit-power table: which audits of the query generator see a leak, cell by cell.

`scripts/audit_power.py` (and `audit_power`) run two kinds of cells per claimed epsilon:
white-box (`synthgen.audit.whitebox`: one DP step of a project generator with m canary
gradients) and black-box (`synthgen.audit.blackbox`: the generator trained by
`dp_train.train` on private pairs plus m canaries, scored on the final model only). The
models (`MODELS`) are the `tiny_t5` preset (a random-init T5 "tiny", full fine-tuning) and
`demo_lora` (the CPU demo's `smollm2_lora_cpu`: LoRA rank 8 on SmolLM2-135M), on real
batches of the wiki summaries corpus; `BLACKBOX` holds the black-box sizes. Every cell
writes its aggregates to ``whitebox_<model>_m<m>_eps<tag>.json`` or ``blackbox_...json``;
a cell whose file exists is read back, so an interrupted run resumes (a black-box cell is
re-run whole, with fresh coins). See docs/guides/audits.md.

Privacy:
  The audited runs use the (public) wiki summaries corpus standing in for private pairs;
  the files hold `WhiteboxResult` / `BlackboxResult` aggregates only: no coins, keys or
  scores.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from synthgen.audit import blackbox, whitebox
from synthgen.audit.cells import resumable_cells
from synthgen.audit.claims import epsilon_tag

MODELS = ("tiny_t5", "demo_lora")
PRESETS = {"tiny_t5": "tiny_t5", "demo_lora": "smollm2_lora_cpu"}
# Black-box cell sizes per model: private pairs, epochs, learning rate (None: the preset's).
BLACKBOX = {
    "tiny_t5": dict(num_private=200, epochs=3.0, learning_rate=3e-2),
    "demo_lora": dict(num_private=800, epochs=1.0, learning_rate=None),
}


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
    from synthgen.generator_models import split_trainable

    config, family, params, pairs = load_generator(name)
    rows = pairs.select(range(config.dp.batch_size))
    batch = family.encode_pairs(
        rows["document"], rows["query"], config.input_len, config.target_len
    )
    lora = config.lora_rank > 0
    trainable, frozen = split_trainable(params, lora=lora)
    return AuditedModel(
        name=name,
        description=_description(name, config),
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
      log: progress lines (file names and seconds only).

    Returns:
      One `WhiteboxResult` per epsilon, in order.
    """
    loaded: list = []  # (model, its clipped batch sum), made by the first cell that runs

    def run(epsilon: float, k: int) -> whitebox.WhiteboxResult:
        if not loaded:
            m = load_model(model)
            loaded.extend((m, whitebox.clipped_batch_sum(
                m.loss_fn, m.trainable, m.frozen, m.batch, clip_norm=m.clip_norm,
                microbatch=m.microbatch, tapped_loss_fn=m.tapped_loss_fn,
            )))  # fmt: skip
        m, grad_sum = loaded
        config = whitebox.WhiteboxConfig(
            num_canaries=num_canaries,
            epsilon=epsilon,
            delta=delta,
            clip_norm=m.clip_norm,
            learning_rate=m.learning_rate,
            lora=m.lora,
            microbatch=m.microbatch,
            seed=None if seed is None else seed + k,
        )
        return whitebox.audit_dp_step(
            grad_sum, m.trainable, m.batch_size, config, model=m.description
        )

    return resumable_cells(
        epsilons,
        lambda epsilon: cell_path(out_dir, model, num_canaries, epsilon),
        run,
        whitebox.WhiteboxResult,
        expect=dict(delta=delta, num_canaries=num_canaries),
        log=log,
    )


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


def format_table(results: Sequence[whitebox.WhiteboxResult]) -> str:
    """A Markdown table: one row per (cell, observable)."""
    head = (
        "| model | params | claimed eps | sigma | canaries in/out | observable | "
        f"{whitebox.CellResult.FIGURES} | ok |"
    )
    return whitebox.markdown_table(
        head,
        (
            f"| {r.model.split(' ')[0]} | {r.num_params:,} | {_fmt(r.claimed_epsilon)} | "
            f"{r.noise_multiplier:.3f} | {r.num_in}/{r.num_out} | {s.observable} | "
            f"{r.figure_cells(s)} | {'VIOLATION' if r.violation else 'yes'} |"
            for r in results
            for s in r.stats
        ),
    )


def summary_line(
    results: Sequence[whitebox.WhiteboxResult],
    blackbox_results: Sequence[blackbox.BlackboxResult] = (),
) -> str:
    """The issue's last line: each key the primary observable's epsilon-count bound.

    A key whose cell was not run is `nan`; `cap` is the epsilon-count cap of the
    non-private white-box cell's canaries (else of the non-private black-box cell), the
    analysis of the `*_eps_lb` keys.
    """

    def find(cells, target: float):
        return next((r for r in cells if r.target_epsilon == target), None)

    nonprivate, dp8 = find(results, math.inf), find(results, 8.0)
    bb_nonprivate, bb_dp8 = find(blackbox_results, math.inf), find(blackbox_results, 8.0)
    value = lambda r: "nan" if r is None else f"{r.primary.epsilon_one_run:.4f}"  # noqa: E731
    cap = next((r for r in (nonprivate, dp8, bb_nonprivate, bb_dp8) if r is not None), None)
    return (
        f"nonprivate_eps_lb={value(bb_nonprivate)} dp8_eps_lb={value(bb_dp8)} "
        f"whitebox_nonprivate_eps_lb={value(nonprivate)} whitebox_dp8_eps_lb={value(dp8)} "
        f"cap={'nan' if cap is None else f'{cap.cap_one_run:.4f}'}"
    )


# ---- black-box cells -------------------------------------------------------------------------


def load_generator(name: str):
    """(preset config, family, base params, wiki-summaries pairs) of the named generator.

    Raises:
      ValueError: an unknown name.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(MODELS)}")
    from dpsynth.config_files import querygen_preset
    from synthgen import querygen
    from synthgen.corpora import load_wiki_summaries

    config = querygen_preset(PRESETS[name])
    pairs = load_wiki_summaries()
    with tempfile.TemporaryDirectory() as tokenizer_dir:  # a public vocabulary, discarded
        family, params = querygen.load_base(config, tokenizer_dir=Path(tokenizer_dir), seed=0)
    return config, family, params, pairs


def _description(name: str, config) -> str:
    """The public label of `name`'s generator (preset, family, base, LoRA rank)."""
    return f"{PRESETS[name]} ({config.family} {config.base}, LoRA {config.lora_rank})"


def _preset_dp(model: str):
    """The DP config of `model`'s generator preset (no weights loaded)."""
    from dpsynth.config_files import querygen_preset

    return querygen_preset(PRESETS[model]).dp


def blackbox_cell_path(
    out_dir: str | Path,
    model: str,
    kind: str,
    num_canaries: int,
    epsilon: float,
    epochs: float | None = None,
    batch_size: int | None = None,
) -> Path:
    """The cell's file; epochs other than the model's default (`BLACKBOX`) and a batch size
    other than the preset's are part of the name (None: the default, untagged)."""
    default_epochs = BLACKBOX.get(model, {}).get("epochs")
    tag = "" if epochs is None or epochs == default_epochs else f"_ep{epochs:g}"
    if batch_size is not None and batch_size != _preset_dp(model).batch_size:
        tag += f"_b{batch_size}"
    name = f"blackbox_{model}_{kind}_m{num_canaries}{tag}_eps{epsilon_tag(epsilon)}.json"
    return Path(out_dir) / name


def run_blackbox_cells(
    out_dir: str | Path,
    model: str,
    epsilons: Sequence[float],
    *,
    kind: str = "new",
    num_canaries: int = 1000,
    num_private: int | None = None,
    epochs: float | None = None,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    delta: float = 1e-5,
    seed: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> list[blackbox.BlackboxResult]:
    """Runs (or reads back) one black-box cell per epsilon for `model`; resumable by cell.

    Args:
      out_dir, model, num_canaries, delta, seed, log: as `run_whitebox_cells`.
      epsilons: target epsilons; `math.inf` is the non-private run (clipping, no noise).
      kind: "new" or "rare" (`synthgen.audit.blackbox.KINDS`).
      num_private, epochs, learning_rate: default `BLACKBOX[model]` (learning rate None:
        the preset's).
      batch_size: the expected batch of the audited runs, at most `num_private` (None: the
        preset's).
      progress: dp_train's progress bar (steps and epsilon only).

    Returns:
      One `BlackboxResult` per epsilon, in order.

    Raises:
      ValueError: a bad batch size, too few corpus rows, or a cell file made with other
        settings (`cells.read_back`).
    """
    preset = _preset_dp(model)
    given = dict(num_private=num_private, epochs=epochs, learning_rate=learning_rate)
    sizes = BLACKBOX.get(model, {}) | {key: v for key, v in given.items() if v is not None}
    # Resolved, so that a file records (and is checked against) the values that ran.
    sizes["learning_rate"] = sizes.get("learning_rate") or preset.learning_rate
    sizes["batch_size"] = batch_size or preset.batch_size
    if not isinstance(sizes["batch_size"], int) or not (
        1 <= sizes["batch_size"] <= sizes["num_private"]
    ):
        # The sampler needs B <= the rows present, which are n plus the coins' canaries.
        raise ValueError(
            f"batch_size must be an integer in [1, num_private = {sizes['num_private']}], "
            f"got {sizes['batch_size']!r}"
        )
    loaded: list = []  # `load_generator(model)`, by the first cell that runs

    def run(epsilon: float, k: int) -> blackbox.BlackboxResult:
        if not loaded:
            loaded.extend(load_generator(model))
        config, family, params, pairs = loaded
        n = sizes["num_private"]
        if n + num_canaries > len(pairs):
            raise ValueError(f"{n} pairs + {num_canaries} canaries exceed the {len(pairs)} rows")
        private, sources = pairs.select(range(n)), pairs.select(range(n, n + num_canaries))
        cell = blackbox.BlackboxConfig(
            num_canaries=num_canaries,
            kind=kind,
            epsilon=epsilon,
            delta=delta,
            epochs=sizes["epochs"],
            learning_rate=sizes["learning_rate"],
            batch_size=sizes["batch_size"],
            seed=None if seed is None else seed + k,
        )
        return blackbox.audit_querygen(
            family,
            params,
            private["document"],
            private["query"],
            sources["document"],
            sources["query"],
            config.dp,
            cell,
            input_len=config.input_len,
            target_len=config.target_len,
            lora=config.lora_rank > 0,
            model=_description(model, config),
            progress=progress,
        )

    return resumable_cells(
        epsilons,
        lambda epsilon: blackbox_cell_path(
            out_dir, model, kind, num_canaries, epsilon, sizes["epochs"], sizes["batch_size"]
        ),
        run,
        blackbox.BlackboxResult,
        expect=dict(kind=kind, delta=delta, num_canaries=num_canaries, **sizes),
        log=log,
        describe=lambda r: (
            f"{r.seconds:.1f} s ({r.steps} steps, train {r.train_seconds:.1f} s, score "
            f"{r.score_seconds:.1f} s)"
        ),
    )


def format_blackbox_table(results: Sequence[blackbox.BlackboxResult]) -> str:
    """A Markdown table: one row per black-box cell."""
    head = (
        "| model | kind | claimed eps | sigma | epochs | batch | steps | canaries in/out | "
        f"{whitebox.CellResult.FIGURES} | minutes | ok |"
    )
    return whitebox.markdown_table(
        head,
        (
            f"| {r.model.split(' ')[0]} | {r.kind} | {_fmt(r.claimed_epsilon)} | "
            f"{r.noise_multiplier:.3f} | {r.epochs:g} | {r.batch_size} | {r.steps} | "
            f"{r.num_in}/{r.num_out} | {r.figure_cells(r.primary)} | {r.seconds / 60:.1f} | "
            f"{'VIOLATION' if r.violation else 'yes'} |"
            for r in results
        ),
    )
