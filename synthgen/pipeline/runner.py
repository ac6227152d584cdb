"""Runs the main job's stages in order, each one resumable and recomputed only when needed.

Every stage writes `<run>/stages/<name>.json`: its fingerprint, status, timing and peak
memory, and a public summary (counts, epsilons, metrics; never private text). A stage's
fingerprint hashes its config sections and the fingerprints of the stages it reads, so a
changed config section invalidates exactly the stages downstream of it. A stage whose record
is "running" was interrupted: calling it again with the same fingerprint resumes it (the DP
generator and the encoder resume from their checkpoints, and a charge is never made twice);
with another fingerprint its outputs are removed first.

Run folder::

  ledger.sqlite        every charge of the run (public events: mechanism, epsilon, delta)
  private/             mode 0700: the private split, secret resume state (noise keys, sampler
                       states), the non-private upper-bound encoder; never ship it
  data/corpus.jsonl    the public documents
  generator/, synthetic/, encoder/, index/, rag/   the stages' releases
  shards/<stage>/      a sharded stage's shard folders until it joins them (`stage_shards`)
  stages/<name>.json   stage records (mode 0700: timings and non-DP evaluation figures)
  report/              report.html, metrics.json, the PNGs (mode 0700: operator only)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from synthgen.pipeline.config import PipelineConfig
from synthgen.pipeline.memory import StagePeak
from synthgen.work_folder import private_folder

STAGES = ("data", "generate", "train", "evaluate", "index", "rag", "report")
# The config sections each stage reads, and the stages whose outputs it reads.
STAGE_SECTIONS = {
    "data": ("data", "seed"),
    "generate": ("generate", "privacy", "seed"),
    "train": ("encoder", "seed"),
    "evaluate": ("evaluate",),
    "index": ("index",),
    "rag": ("rag", "privacy"),
    "report": ("name", "report"),
}
UPSTREAM = {
    "data": (),
    "generate": ("data",),
    "train": ("generate",),
    "evaluate": ("train",),
    "index": ("train",),
    "rag": ("train",),
    "report": ("evaluate", "index", "rag"),
}
# Private work folders a stage keeps until its done record is written, then removes.
STAGE_SECRETS = {"generate": ("private/work/generate", "private/work/generate-sampling")}
# What each stage writes (relative to the run folder), removed when its config changed.
STAGE_OUTPUTS = {
    "data": ("data", "private/data"),
    "generate": (
        "generator",
        "synthetic",
        "samples",
        "private/work/generate",
        "private/work/generate-sampling",
    ),
    "train": ("encoder", "private/real_encoder", "private/work/train"),
    "evaluate": (),
    "index": ("index",),
    "rag": ("rag", "private/rag"),
    "report": ("report",),
}


class StageNotReadyError(ValueError):
    """A stage was asked for before the stages it reads are done under this config."""


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """Paths of one run."""

    root: Path

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.sqlite"

    @property
    def private(self) -> Path:
        """The private folder (created with mode 0700)."""
        return private_folder(self.root / "private")

    def check_is_run(self) -> None:
        """Refuses a non-empty folder that is not a run folder: the runner removes stage
        outputs by name (data/, index/, ...) and must never touch a user's own folders."""
        if self.root.is_dir() and any(self.root.iterdir()) and not (self.root / "stages").is_dir():
            raise ValueError(
                f"{self.root} is not empty and holds no pipeline run (no stages/ folder): "
                "choose a new or empty run folder"
            )

    def record_path(self, stage: str) -> Path:
        return self.root / "stages" / f"{stage}.json"

    def record(self, stage: str) -> dict | None:
        path = self.record_path(stage)
        return json.loads(path.read_text()) if path.is_file() else None

    def write_record(self, stage: str, record: dict) -> None:
        path = self.record_path(stage)
        private_folder(path.parent)  # operator only: timings and non-DP evaluation figures
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, allow_nan=False))
        tmp.replace(path)

    def summary(self, stage: str) -> dict:
        record = self.record(stage)
        if record is None or record["status"] != "done":
            raise StageNotReadyError(f"stage {stage!r} has not finished in {self.root}")
        return record["summary"]


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What a stage function gets: the config, the run folder, whether to show bars, and
    whether to stop the generate stage once its generator is trained (`--train-only`)."""

    config: PipelineConfig
    run: RunFolder
    progress: bool = True
    train_only: bool = False

    def log(self, stage: str, message: str) -> None:
        print(f"[{stage}] {message}", file=sys.stderr, flush=True)


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return {
            f.name: _jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not _omitted(f, getattr(value, f.name))
        }
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return "nan"
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def _omitted(field: dataclasses.Field, value) -> bool:
    """A field marked FINGERPRINT_AT_DEFAULT left at its default (see pipeline.config)."""
    return field.metadata.get("fingerprint") == "omit-at-default" and value == field.default


def fingerprints(config: PipelineConfig) -> dict[str, str]:
    """Each stage's fingerprint: its config sections and its upstream stages' fingerprints."""
    out: dict[str, str] = {}
    for stage in STAGES:
        payload = {
            "stage": stage,
            "sections": {s: _jsonable(getattr(config, s)) for s in STAGE_SECTIONS[stage]},
            "upstream": [out[u] for u in UPSTREAM[stage]],
        }
        text = json.dumps(payload, sort_keys=True, default=str)
        out[stage] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def stage_status(config: PipelineConfig, run: RunFolder) -> dict[str, str]:
    """ "done", "stale" (done under another config), "interrupted" or "missing" per stage."""
    fps, out = fingerprints(config), {}
    for stage in STAGES:
        record = run.record(stage)
        if record is None:
            out[stage] = "missing"
        elif record["fingerprint"] != fps[stage] or record["status"] == "stale-upstream":
            out[stage] = "stale"
        else:
            out[stage] = "done" if record["status"] == "done" else "interrupted"
    return out


def _clean(run: RunFolder, stage: str, fingerprint: str) -> None:
    """Removes a stage's outputs before it is recomputed, and its shards of other configs
    (all of the generate stage's: a recomputed generate stage trains a new generator)."""
    from synthgen.pipeline.stage_shards import remove_shards

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
    queries or joins the shards (`synthgen.pipeline.stage_shards`). One process at a time
    runs a stage of a run folder (`stage_lock`).

    Raises:
      StageNotReadyError: a stage it reads is not done under this config.
      StageBusyError: another process is running this stage (or one of its shards).
      ValueError: unknown stage; `train_only` on another stage or a few-shot generator.
    """
    from synthgen.pipeline.stages import PRECHECKS, STAGE_FUNCTIONS, check_shardable

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
        running = {
            "stage": stage,
            "fingerprint": fps[stage],
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
            "status": "done",
            "started": started,
            "seconds": round(time.time() - started, 2),
            "peak_memory_bytes": peak.bytes,
            "peak_memory_exact": peak.exact,  # False: the highest sample, a lower bound
            "summary": _jsonable(summary),
        }
        run.write_record(stage, record)
        for rel in STAGE_SECRETS.get(stage, ()):  # only now: a resume before this needs them
            shutil.rmtree(run.root / rel, ignore_errors=True)
        return record


def check_upstream(stage: str, status: dict[str, str]) -> None:
    """Refuses `stage` (or a shard of it) while a stage it reads is not done.

    Raises:
      StageNotReadyError: naming the stage to run first.
    """
    for upstream in UPSTREAM[stage]:
        if status[upstream] != "done":
            raise StageNotReadyError(
                f"stage {stage!r} reads {upstream!r}, which is {status[upstream]} under this "
                f"config: run `synthgen pipeline {upstream}` (or the whole pipeline) first"
            )


class StageBusyError(ValueError):
    """Another process holds the stage (running it, or one of its shards)."""


@contextlib.contextmanager
def stage_lock(run: RunFolder, stage: str, *, exclusive: bool):
    """Holds `stage`'s lock in `run` while the block runs: exclusive for the stage itself,
    shared for its shards (so shards run side by side, but never beside the stage's own run,
    which joins and then removes them). An advisory `flock` on ``stages/.<stage>.lock``, let
    go when the process ends, however it ends.

    Raises:
      StageBusyError: the lock is held in a conflicting mode.
    """
    import fcntl

    path = run.record_path(stage).with_name(f".{stage}.lock")
    private_folder(path.parent)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StageBusyError(
                f"another process is running stage {stage!r} "
                f"{'or one of its shards ' if exclusive else ''}in {run.root}: wait for it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def later_reads(later: str, stage: str) -> bool:
    """Whether `later` reads `stage`'s outputs, directly or through other stages."""
    return stage in UPSTREAM[later] or any(later_reads(u, stage) for u in UPSTREAM[later])


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
