"""The output folder of a run: the synthetic rows and metadata.json with the guarantee.

Privacy:
  The folder is released: it holds DP outputs (texts decoded from released tokens) and
  declared or DP figures only (the plan, the config, the count of released tokens); no
  real pool size, no timing, no mechanism randomness.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from synthgen.fewshot.config import FewShotConfig
from synthgen.fewshot.generation import FewShotResult
from synthgen.fewshot.prompts import PromptTemplate
from synthgen.privacy.receipts import Receipt
from synthgen.privacy.release_plan import ReleasePlan

SEEDED_NOTE = (
    "the mechanism's randomness came from a fixed seed: reproducible by anyone who knows "
    "the seed, so this output is for tests only, not for publication"
)


def write_output(
    out_dir: str,
    columns: Mapping[str, Sequence[Any]],
    result: FewShotResult,
    config: FewShotConfig,
    *,
    model: str,
    template: PromptTemplate,
    name: str = "synthetic",
    rows: str = "all rows of the private data",
    seeded: bool = False,
) -> dict:
    """Writes the run's release: `<name>.jsonl`, `<name>.parquet` and metadata.json.

    Args:
      out_dir: output folder (released: public figures and DP outputs only).
      columns: the released columns.
      result: the run's result.
      config: the run's hyper-parameters (all public, the pool size declared).
      model: backend description.
      template: the prompt layout.
      name: file stem.
      rows: which private rows the guarantee covers (e.g. a split or a limit).
      seeded: the mechanism's randomness came from a fixed seed (tests only).

    Returns:
      The metadata written (`write_release`).

    Privacy:
      Only declared or DP figures: the plan, the config, the count of released tokens.
    """
    return write_release(
        out_dir,
        columns,
        result.plan,
        result.receipt,
        name=name,
        rows=rows,
        seeded=seeded,
        described={
            "post_processing": "texts are decoded from DP-released tokens and stripped",
            "model": {"backend": model},
            "generation": {
                "method": "DP few-shot generation (Tang et al. 2024)",
                "config": dataclasses.asdict(config),
                "template": dataclasses.asdict(template),
                "tokens_released": result.tokens_released,
            },
        },
    )


def write_release(
    out_dir: str | Path,
    columns: Mapping[str, Sequence[Any]],
    plan: ReleasePlan,
    receipt: Receipt | None,
    *,
    name: str,
    rows: str,
    seeded: bool,
    described: Mapping[str, Any],
) -> dict:
    """Writes a synthetic-data release: `<name>.jsonl`, `<name>.parquet` and metadata.json.

    The one layout of the few-shot and Private Evolution releases: the guarantee (`plan`),
    the private `rows` it covers and the (tenant, dataset) of the run's `receipt` (None for
    an uncharged run), where the randomness came from (`seeded`: a fixed seed, tests only),
    then `described` (the generator's public blocks: post_processing, model, generation),
    the row count and each file's SHA-256. Returns the metadata written.
    """
    import datasets

    from synthgen.assets import file_sha256

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset = datasets.Dataset.from_dict({k: list(v) for k, v in columns.items()})
    dataset.to_json(out / f"{name}.jsonl", lines=True, force_ascii=False)
    dataset.to_parquet(out / f"{name}.parquet")
    privacy = plan.to_dict()
    privacy["rows_covered"] = rows
    privacy["ledger_scope"] = (
        None if receipt is None else {"tenant": receipt.tenant, "dataset": receipt.dataset}
    )
    metadata = {
        "privacy": privacy,
        "randomness": {"seeded": seeded, "note": SEEDED_NOTE if seeded else "OS entropy"},
        **described,
        "num_examples": len(dataset),
        "files": {f: file_sha256(out / f) for f in (f"{name}.jsonl", f"{name}.parquet")},
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, default=str))
    return metadata
