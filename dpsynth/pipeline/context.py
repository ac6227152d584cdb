"""What every stage of the main job shares: the stage table, the run folder, the stage context,
fingerprints, status and the stage lock.

The bottom of `dpsynth.pipeline`: the stage modules (`stages`, `retrieval_stages`,
`rag_stage`, `report`) import it and `runner` composes them; nothing here imports a stage, so
the stages never import the runner back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

from dpsynth.pipeline.config import FINGERPRINT_AS, PipelineConfig
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
# The config fields naming private files a stage reads: an edited file makes it stale.
INPUT_FILES = {"data": ("pairs", "documents"), "rag": ("records",)}
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


def jsonable(value):
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if _omitted(f, item):
                continue
            stand_in = f.metadata.get(FINGERPRINT_AS)  # hashed as the fields it replaced
            out.update(stand_in(item) if stand_in else {f.name: jsonable(item)})
        return out
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
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
            "sections": {s: jsonable(getattr(config, s)) for s in STAGE_SECTIONS[stage]},
            "upstream": [out[u] for u in UPSTREAM[stage]],
        }
        text = json.dumps(payload, sort_keys=True, default=str)
        out[stage] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return out


def input_digests(config: PipelineConfig, stage: str) -> dict[str, str]:
    """SHA-256 of each file named by `stage`'s `INPUT_FILES` (kept in its record, 0700)."""
    from synthgen.assets import file_sha256

    paths = [getattr(getattr(config, stage), f) for f in INPUT_FILES.get(stage, ())]
    return {str(p): file_sha256(p) for p in paths if p is not None and Path(p).is_file()}


def stage_status(config: PipelineConfig, run: RunFolder) -> dict[str, str]:
    """ "done", "stale" (done under another config, or on an input file edited since, or
    reading such a stage), "interrupted" or "missing" per stage. An input file gone since
    (or a record without "inputs", written before they were kept) is not compared."""
    fps, out, edited = fingerprints(config), {}, set()
    for stage in STAGES:
        record = run.record(stage)
        kept = (record or {}).get("inputs") or {}
        now = input_digests(config, stage) if kept else {}
        if any(now.get(path, digest) != digest for path, digest in kept.items()) or any(
            u in edited for u in UPSTREAM[stage]
        ):
            edited.add(stage)
        if record is None:
            out[stage] = "missing"
        elif stage in edited or record["fingerprint"] != fps[stage]:
            out[stage] = "stale"
        elif record["status"] == "stale-upstream":
            out[stage] = "stale"
        else:
            out[stage] = "done" if record["status"] == "done" else "interrupted"
    return out


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


def check_run_scope(ledger, scope) -> None:
    """Refuses, read-only, a `scope` the run's ledger holds with other caps: a run's scopes
    never change under it (a lower cap would not be enforced, a higher one would hide what
    was already spent), nor does their tenant (the same private data charged under a second
    tenant would start from zero, and each scope's statement would miss the other's). A
    collection cap (tenant ``COLLECTION``) sits beside the run's tenant."""
    from synthgen.privacy.ledger_types import COLLECTION

    for stored in ledger.scopes():
        if scope.is_collection or stored.dataset != scope.dataset:
            continue
        if stored.tenant not in (scope.tenant, COLLECTION):
            raise ValueError(
                f"the run's ledger charges {scope.dataset} to tenant {stored.tenant!r}, but the "
                f"config names tenant {scope.tenant!r}: one run's private data has one tenant; "
                "restore privacy.tenant or start a new run folder (--out)"
            )
    try:
        stored = ledger.get_scope(scope.tenant, scope.dataset)
    except KeyError:
        return
    if stored != scope:
        raise ValueError(
            f"the run's ledger holds scope ({scope.tenant}, {scope.dataset}) with epsilon cap "
            f"{stored.epsilon_cap:g} and delta {stored.delta_cap:.3g}, but the config asks for "
            f"{scope.epsilon_cap:g} and {scope.delta_cap:.3g}: restore the config's privacy "
            "settings or start a new run folder (--out)"
        )


def open_run_scope(ledger, scope) -> None:
    """Opens `scope` in the run's ledger after `check_run_scope` (an equal stored scope is
    kept)."""
    check_run_scope(ledger, scope)
    ledger.open_scope(scope)
