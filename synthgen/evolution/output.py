"""The released folder of a Private Evolution run: samples and metadata.json.

Privacy:
  The folder is released: the samples (DP outputs) and public figures only (the plan, the
  config, the model's name); no private count, no timing, no randomness of the mechanism.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from synthgen.evolution.config import EvolutionConfig
from synthgen.evolution.generation import EvolutionResult
from synthgen.fewshot.output import SEEDED_NOTE


def write_output(
    out_dir: str | Path,
    result: EvolutionResult,
    config: EvolutionConfig,
    *,
    model: str,
    encoder: str,
    rows: str = "all rows of the private data",
    seeded: bool = False,
    name: str = "synthetic",
) -> dict:
    """Writes `<name>.jsonl`, `<name>.parquet` (label, text) and metadata.json.

    Args:
      out_dir: output folder (released).
      result: the run's result.
      config: its public parameters.
      model: the LM backend's description.
      encoder: the embedding model's name.
      rows: which private rows the guarantee covers.
      seeded: the randomness came from a fixed seed (tests only).
      name: file stem.

    Returns:
      The metadata written.
    """
    import datasets

    from synthgen.assets import file_sha256

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset = datasets.Dataset.from_dict({"label": result.labels, "text": result.texts})
    dataset.to_json(out / f"{name}.jsonl", lines=True, force_ascii=False)
    dataset.to_parquet(out / f"{name}.parquet")
    privacy = result.plan.to_dict()
    privacy["rows_covered"] = rows
    receipt = result.receipt  # the (tenant, dataset) charged, None for an uncharged run
    privacy["ledger_scope"] = (
        None if receipt is None else {"tenant": receipt.tenant, "dataset": receipt.dataset}
    )
    metadata = {
        "privacy": privacy,
        "randomness": {"seeded": seeded, "note": SEEDED_NOTE if seeded else "OS entropy"},
        "post_processing": "samples are LM outputs of public prompts, selected by DP histograms",
        "model": {"backend": model, "encoder": encoder},
        "generation": {
            "method": "Private Evolution for text (Lin et al. 2024; Xie et al. 2024)",
            "config": dataclasses.asdict(config),
            "selected_share_per_iteration": result.selected_share,
            "samples_generated": result.samples_generated,
        },
        "num_examples": len(dataset),
        "files": {f: file_sha256(out / f) for f in (f"{name}.jsonl", f"{name}.parquet")},
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, default=str))
    return metadata
