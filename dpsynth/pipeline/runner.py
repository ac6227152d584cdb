"""Runs the main job's stages in order, each one resumable and recomputed only when needed.

The top of `dpsynth.pipeline`: it composes the stage functions (`stages`,
`retrieval_stages`, `rag_stage`, `report`, `stage_shards`) over what they share
(`dpsynth.pipeline.context`), and none of them imports it back.

Every stage writes `<run>/stages/<name>.json` (fingerprint, status, timing, peak memory, a
public summary). A fingerprint hashes the stage's config sections and the fingerprints of
the stages it reads, so a changed section invalidates exactly the stages downstream; a
"running" record with the same fingerprint resumes (a charge is never made twice), with
another its outputs are removed first. The run folder's layout and the resume rules are in
docs/guides/pipeline.md.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dpsynth.pipeline.config import PipelineConfig
from dpsynth.pipeline.context import (
    STAGE_OUTPUTS,
    STAGE_SECRETS,
    STAGES,
    RunFolder,
    StageContext,
    check_upstream,
    fingerprints,
    input_digests,
    jsonable,
    later_reads,
    stage_lock,
    stage_status,
)
from dpsynth.pipeline.memory import StagePeak
from dpsynth.pipeline.rag_stage import answer_questions
from dpsynth.pipeline.report import write_report
from dpsynth.pipeline.retrieval_stages import evaluate_stage, index_shard, index_stage, train_stage
from dpsynth.pipeline.stage_shards import SHARDABLE, remove_shards, shard_folder
from dpsynth.pipeline.stages import (
    check_shardable,
    data_stage,
    generate_precheck,
    generate_shard,
    generate_stage,
)
from synthgen.shards import Shard

STAGE_FUNCTIONS: dict[str, Callable[[StageContext], dict]] = {
    "data": data_stage,
    "generate": generate_stage,
    "train": train_stage,
    "evaluate": evaluate_stage,
    "index": index_stage,
    "rag": answer_questions,
    "report": write_report,
}
# Checks run before a stage's previous outputs are removed (not when resuming).
PRECHECKS: dict[str, Callable[[StageContext], None]] = {"generate": generate_precheck}
# The stages that take --shard, and the function that runs one shard into its folder.
SHARD_FUNCTIONS = {"generate": generate_shard, "index": index_shard}


def _clean(run: RunFolder, stage: str, fingerprint: str) -> None:
    """Removes a stage's outputs before it is recomputed, and its shards of other configs
    (all of the generate stage's: a recomputed generate stage trains a new generator)."""
    for rel in STAGE_OUTPUTS[stage]:
        shutil.rmtree(run.root / rel, ignore_errors=True)
    remove_shards(run.root, stage, keep=None if stage == "generate" else fingerprint)


def run_stage(
    stage: str,
    config: PipelineConfig,
    run: RunFolder,
    *,
    force: bool = False,
    progress: bool = True,
    train_only: bool = False,
) -> dict:
    """Runs one stage if it is not done under this config (or `force`); returns its record.

    With `train_only` (generate stage only), the stage stops once the DP generator is trained
    and charged; its record stays "running" until `synthgen pipeline generate` samples the
    queries or joins the shards (`dpsynth.pipeline.stage_shards`). One process at a time
    runs a stage of a run folder (`stage_lock`).

    Raises:
      StageNotReadyError: a stage it reads is not done under this config.
      StageBusyError: another process is running this stage (or one of its shards).
      ValueError: unknown stage; `train_only` on another stage or a few-shot generator.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    if train_only:
        if stage != "generate":
            raise ValueError(f"--train-only is an option of the generate stage, not of {stage!r}")
        check_shardable(config, "--train-only")
    status, fps = stage_status(config, run), fingerprints(config)
    check_upstream(stage, status)
    run.check_is_run()
    with stage_lock(run, stage, exclusive=True):
        status = stage_status(config, run)  # as it is now that this process holds the stage
        record = run.record(stage)
        run.private  # noqa: B018 - created owner-only before any stage writes into it
        if status[stage] == "done" and not force:
            print(f"[{stage}] up to date (fingerprint {fps[stage]}), skipped", file=sys.stderr)
            _remove_secrets(run, stage)  # left by a run stopped right after its done record
            return record
        context = StageContext(config, run, progress, train_only)
        if status[stage] == "interrupted" and not force:
            print(f"[{stage}] resuming an interrupted run", file=sys.stderr)
        else:
            if stage in PRECHECKS:
                PRECHECKS[stage](context)  # refuses before the previous outputs are removed
            _clean(run, stage, fps[stage])  # with or without a record: never reuse outputs
        # A stage recomputed invalidates its downstream records (their fingerprints match).
        for later in STAGES[STAGES.index(stage) + 1 :]:
            if later_reads(later, stage):
                path = run.record_path(later)
                if path.is_file():
                    stale = json.loads(path.read_text())
                    stale["status"] = "stale-upstream"
                    run.write_record(later, stale)
        started = time.time()
        inputs = input_digests(config, stage)  # as read now: an edit after makes it stale
        running = {
            "stage": stage,
            "fingerprint": fps[stage],
            "inputs": inputs,
            "status": "running",
            "started": started,
        }
        run.write_record(stage, running)
        function: Callable[[StageContext], dict] = STAGE_FUNCTIONS[stage]
        with StagePeak() as peak:  # the process's own peak mark is never reset
            summary = function(context)
        if train_only:  # the stage stays open: its queries (or shards) come next
            return {**running, "seconds": round(time.time() - started, 2), "summary": summary}
        record = {
            "stage": stage,
            "fingerprint": fps[stage],
            "inputs": inputs,
            "status": "done",
            "started": started,
            "seconds": round(time.time() - started, 2),
            "peak_memory_bytes": peak.bytes,
            "peak_memory_exact": peak.exact,  # False: the highest sample, a lower bound
            "summary": jsonable(summary),
        }
        run.write_record(stage, record)
        _remove_secrets(run, stage)  # only now: a resume before this needs them
        return record


def _remove_secrets(run: RunFolder, stage: str) -> None:
    for rel in STAGE_SECRETS.get(stage, ()):
        shutil.rmtree(run.root / rel, ignore_errors=True)


def run_shard(stage: str, config, run, shard: Shard, *, progress: bool = True) -> dict:
    """Runs shard `shard` of `stage` into its shard folder; the stage's record is not touched.

    Returns:
      {"stage", "shard", "status": "shard done", "seconds", "folder", "summary"}.

    Raises:
      StageNotReadyError: a stage it reads is not done (for generate: the generator is not
        trained, see `--train-only`).
      StageBusyError: the stage itself is running in another process.
      ValueError: a stage that takes no shards, or one already done under this config.
    """
    if stage not in SHARD_FUNCTIONS:
        raise ValueError(f"only the {' and '.join(SHARDABLE)} stages take --shard, not {stage!r}")
    if stage == "generate":
        check_shardable(config, "--shard")
    run.check_is_run()
    with stage_lock(run, stage, exclusive=False):  # beside other shards, never the stage's run
        status, fps = stage_status(config, run), fingerprints(config)
        check_upstream(stage, status)
        if status[stage] == "done":
            raise ValueError(
                f"stage {stage!r} is done under this config: there is nothing left to shard"
            )
        folder = shard_folder(run.root, stage, fps[stage], shard)
        partial = folder.with_name(folder.name + ".partial")
        for path in (partial, folder):
            shutil.rmtree(path, ignore_errors=True)
        partial.mkdir(parents=True)  # seen by the stage's join as unfinished from now on
        started = time.time()
        summary = SHARD_FUNCTIONS[stage](StageContext(config, run, progress), shard, partial)
        partial.rename(folder)
    return {
        "stage": stage,
        "shard": str(shard),
        "status": "shard done",
        "seconds": round(time.time() - started, 2),
        "folder": str(folder),
        "summary": summary,
    }


def run_pipeline(
    config: PipelineConfig,
    out: str | Path | None = None,
    *,
    start: str | None = None,
    progress: bool = True,
) -> RunFolder:
    """Runs every stage that is not done under `config`, in order; returns the run folder.

    Args:
      config: the job's config.
      out: the run folder (default `config.out`).
      start: recompute this stage and every stage after it (`--from`); the stages before it
        must be done under this config.
      progress: show progress bars.
    """
    run = RunFolder(Path(out or config.out))
    run.check_is_run()
    run.root.mkdir(parents=True, exist_ok=True)
    if start is not None and start not in STAGES:
        raise ValueError(f"unknown stage {start!r}; stages: {', '.join(STAGES)}")
    first = STAGES.index(start) if start else 0
    for stage in STAGES[first:]:
        run_stage(stage, config, run, force=start is not None, progress=progress)
    return run
