"""The generate and index stages in shards: N jobs write shard folders, the stage joins them.

Any scheduler can fan the shards out (``--shard I/N``) as long as every job sees the same
run folder at the same path. A shard writes ``shards/<stage>/<fingerprint>/<I>-of-<N>.partial/``
and renames it when done, so a crashed or running shard is never taken for a finished one;
a stage run without ``--shard`` joins a complete set (byte for byte the unsharded output,
`synthgen.shards`), refuses an incomplete one, and removes the shards once joined. Shards
hold their stage's lock shared and the stage's own run holds it exclusively
(`context.stage_lock`). See docs/guides/scaling.md (The main job in shards).

Privacy:
  Shards spend nothing: the generate stage's DP training runs once (``--train-only``) and is
  charged once; its shards are post-processing of the released generator (sampling on
  public documents, from one seed drawn by that training job and kept in the private work
  folder), and the index's shards embed public documents.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from synthgen.shards import Shard

SHARDABLE = ("generate", "index")
_FINISHED = re.compile(r"(\d+)-of-(\d+)")


def shards_root(run_root: Path, stage: str, fingerprint: str) -> Path:
    """The folder of one stage's shards under one config."""
    return run_root / "shards" / stage / fingerprint


def shard_folder(run_root: Path, stage: str, fingerprint: str, shard: Shard) -> Path:
    return shards_root(run_root, stage, fingerprint) / f"{shard.index}-of-{shard.count}"


def finished_shards(run_root: Path, stage: str, fingerprint: str) -> list[Path]:
    """The stage's finished shard folders in shard order; [] when no shard was run.

    Raises:
      ValueError: a shard is unfinished or missing, or shards of two different counts.
    """
    root = shards_root(run_root, stage, fingerprint)
    if not root.is_dir():
        return []
    finished, unfinished = {}, []
    for path in sorted(root.iterdir()):
        match = _FINISHED.fullmatch(path.name)
        if match:
            finished[int(match.group(1)), int(match.group(2))] = path
        else:
            unfinished.append(path.name)
    if not finished and not unfinished:
        return []
    counts = sorted({count for _, count in finished})
    hint = (
        f"run `synthgen pipeline {stage} --shard I/N` for each missing shard, or remove {root} "
        "to run the stage unsharded"
    )
    if len(counts) > 1:
        raise ValueError(f"{root} holds shards of {counts} jobs (I/N with different N): {hint}")
    if unfinished or not counts:
        raise ValueError(f"{root}: shard(s) {', '.join(unfinished)} are not finished: {hint}")
    count = counts[0]
    missing = [f"{i}/{count}" for i in range(count) if (i, count) not in finished]
    if missing:
        raise ValueError(f"{root}: shard(s) {', '.join(missing)} are missing: {hint}")
    return [finished[i, count] for i in range(count)]


def shard_progress(run_root: Path, stage: str, fingerprint: str) -> str | None:
    """'2 of 3 shards finished' (for `synthgen pipeline status`), or None without shards."""
    root = shards_root(run_root, stage, fingerprint)
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    done = [_FINISHED.fullmatch(n) for n in names]
    counts = {int(m.group(2)) for m in done if m}
    if not names:
        return None
    total = "/".join(map(str, sorted(counts))) if counts else "?"
    return f"{sum(1 for m in done if m)} of {total} shards finished"


def remove_shards(run_root: Path, stage: str, keep: str | None = None) -> None:
    """Removes the stage's shards, but for those of fingerprint `keep`."""
    root = run_root / "shards" / stage
    if root.is_dir():
        for path in root.iterdir():
            if path.name != keep:
                shutil.rmtree(path, ignore_errors=True)
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()
