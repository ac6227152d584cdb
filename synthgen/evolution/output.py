"""The released folder of a Private Evolution run: samples and metadata.json.

Privacy:
  The folder is released: the samples (DP outputs) and public figures only (the plan, the
  config, the model's name); no private count, no timing, no randomness of the mechanism.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synthgen.evolution.config import EvolutionConfig
from synthgen.evolution.generation import EvolutionResult
from synthgen.fewshot.output import write_release


def write_output(
    out_dir: str | Path,
    result: EvolutionResult,
    config: EvolutionConfig,
    *,
    model: str,
    encoder: str,
    encoder_provenance: str | None = None,
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
      encoder_provenance: why it is public or DP-trained (a DP-trained encoder's guarantee
        composes with this release's where it was trained on the same rows).
      rows: which private rows the guarantee covers.
      seeded: the randomness came from a fixed seed (tests only).
      name: file stem.

    Returns:
      The metadata written.
    """
    return write_release(
        out_dir,
        {"label": result.labels, "text": result.texts},
        result.plan,
        result.receipt,  # the (tenant, dataset) charged, None for an uncharged run
        name=name,
        rows=rows,
        seeded=seeded,
        described={
            "post_processing": (
                "samples are LM outputs of public prompts, selected by DP histograms"
            ),
            "model": {
                "backend": model,
                "encoder": encoder,
                "encoder_provenance": encoder_provenance,
            },
            "generation": {
                "method": "Private Evolution for text (Lin et al. 2024; Xie et al. 2024)",
                "config": dataclasses.asdict(config),
                "selected_share_per_iteration": result.selected_share,
                "samples_generated": result.samples_generated,
            },
        },
    )
