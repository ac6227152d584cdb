"""`synthgen pipeline`: the main job, whole or one stage at a time.

See docs/guides/pipeline.md (the commands) and docs/guides/scaling.md (stages in shards).
"""

from __future__ import annotations

import inspect
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from synthgen.command_line import HelpGroup, refusals

STAGE_HELP = {
    "data": "Load the private pairs and split them by document (public seed).",
    "generate": "DP synthetic queries (fine-tuned or few-shot generator), charged first.",
    "train": "Dual encoder on the synthetic pairs (and the real-data upper bound).",
    "evaluate": "NDCG/Recall on held-out real queries: zero-shot, synthetic, real.",
    "index": "ScaNN index over the public corpus with the trained encoder.",
    "rag": "A few questions answered by the DP-RAG stage, each charged first.",
    "report": "report.html, metrics.json and the plots.",
}

# str, not Path: Path("./demo") would lose the "./" that makes it a path and not a name.
ConfigOption = Annotated[
    str | None,
    typer.Option(
        help="pipeline config: a .py file, or a packaged example's name (e.g. demo, tiny)"
    ),
]
OutOption = Annotated[Path | None, typer.Option(help="run folder (default: the config's out)")]
ProgressOption = Annotated[
    bool,
    typer.Option(
        "--progress/--no-progress",
        help="progress bars on stderr (--no-progress: none, the datasets library's included)",
    ),
]


def _bars(progress: bool) -> None:
    """--no-progress silences the datasets library's bars too (they are not ours)."""
    if not progress:
        import datasets

        datasets.disable_progress_bars()


pipeline_app = typer.Typer(
    cls=HelpGroup,
    help="The main job: private pairs -> DP synthetic queries -> encoder -> index -> report.",
    invoke_without_command=True,
)


def _load(config: str | None):
    from dpsynth.config_files import UnknownConfigError, pipeline_examples
    from dpsynth.pipeline import load_pipeline_config

    if config is None:
        raise typer.BadParameter(
            f"give --config NAME ({', '.join(pipeline_examples())}) or --config path/to/file.py"
        )
    try:
        cfg = load_pipeline_config(config)
    except UnknownConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--config'") from exc
    if not config.endswith(".py") and "/" not in config and Path(f"{config}.py").is_file():
        print(
            f"note: --config {config} is the packaged example; your ./{config}.py is "
            f"--config {config}.py",
            file=sys.stderr,
        )
    return cfg


@pipeline_app.callback()
def pipeline(
    ctx: typer.Context,
    config: ConfigOption = None,
    out: OutOption = None,
    from_: Annotated[
        str | None, typer.Option("--from", help="recompute this stage and every later one")
    ] = None,
    progress: ProgressOption = True,
) -> None:
    """Runs every stage that is not done under this config, then prints the report's path."""
    if ctx.invoked_subcommand is not None:
        if config is not None or out is not None or from_ is not None:
            raise typer.BadParameter(
                f"put --config/--out after the stage name: synthgen pipeline "
                f"{ctx.invoked_subcommand} --config FILE"
            )
        return
    from dpsynth.pipeline import run_pipeline

    cfg = _load(config)
    _bars(progress)
    run = run_pipeline(cfg, out, start=from_, progress=progress)
    from dpsynth.pipeline.memory import high_water_mark_bytes

    peak = high_water_mark_bytes()
    if peak is not None:  # this process's peak over every stage it ran (as `time -v` sees)
        print(f"peak memory of this run: {peak / 2**30:.2f} GiB")
    print(f"report: {(run.root / 'report' / 'report.html').resolve()}")  # the last line


@pipeline_app.command("status")
def status(config: ConfigOption = None, out: OutOption = None) -> None:
    """Each stage: done, stale (config or an input file changed), interrupted or missing;
    and the config's assets that are not cached yet (a run fetches them first, from PyPI)."""
    from dpsynth.pipeline import RunFolder, fingerprints, stage_status
    from dpsynth.pipeline.config import config_assets
    from dpsynth.pipeline.stage_shards import SHARDABLE, shard_progress
    from synthgen import assets

    cfg = _load(config)
    run = RunFolder(Path(out or cfg.out))
    fps = fingerprints(cfg)
    trained = (run.root / "generator" / "generator.json").is_file()
    for stage, state in stage_status(cfg, run).items():
        notes = []
        if stage == "generate" and state == "interrupted" and trained:
            notes.append("generator trained")
        if stage in SHARDABLE and state != "done":
            notes.append(shard_progress(run.root, stage, fps[stage]))
        notes = [n for n in notes if n]
        print(f"{stage:9s} {state}" + (f" ({'; '.join(notes)})" if notes else ""))
    missing = [name for name in config_assets(cfg) if not assets.is_cached(name)]
    if missing:
        print(
            f"warning: not cached yet: {', '.join(missing)}; the run fetches them first "
            f"(`synthgen assets fetch {' '.join(missing)}`)",
            file=sys.stderr,
        )


RagRecordsOption = Annotated[
    Path | None,
    typer.Option(help="with --pairs: your private collection for the DP-RAG stage, JSONL of "
                 "doc_id and text (default: no DP-RAG stage)"),
]  # fmt: skip
RagQuestionsOption = Annotated[
    Path | None,
    typer.Option(help="with --rag-records: the public questions answered over it, JSONL of "
                 "question (and an expected answer) or one question per line"),
]  # fmt: skip
PresetOption = Annotated[
    str, typer.Option(help="the packaged config the generator and encoder come from")
]


@pipeline_app.command("init")
def init(
    name: Annotated[
        str | None,
        typer.Argument(help="packaged example to copy (none: list them)", show_default=False),
    ] = None,
    to: Annotated[
        Path | None, typer.Option(help="destination file or folder (default: ./NAME.py)")
    ] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing file")] = False,
    pairs: Annotated[
        Path | None,
        typer.Option(help="your private (document, query) pairs, JSONL: a config for them"),
    ] = None,
    documents: Annotated[
        Path | None,
        typer.Option(help="with --pairs: JSONL collection of public documents to index"),
    ] = None,
    query_field: Annotated[str, typer.Option(help="the pairs' query field")] = "query",
    document_field: Annotated[
        str, typer.Option(help="the pairs' document text field (without --documents)")
    ] = "document",
    doc_id_field: Annotated[str, typer.Option(help="the pairs' document id field")] = "doc_id",
    text_field: Annotated[str, typer.Option(help="the collection's text field")] = "text",
    id_field: Annotated[
        str | None, typer.Option(help="the collection's id field (default: --doc-id-field)")
    ] = None,
    rag_records: RagRecordsOption = None,
    rag_questions: RagQuestionsOption = None,
    preset: PresetOption = "demo",
) -> None:
    """Copies a packaged example config to a file you can edit, and says how to run it; with
    --pairs, writes a config for your own pairs file instead (checked line by line first)."""
    from dpsynth.config_files import UnknownConfigError, copy_pipeline_example, pipeline_examples

    if pairs is not None:
        _init_pairs(
            name, to, force, pairs, documents, preset,
            (query_field, document_field, doc_id_field, text_field, id_field),
            (rag_records, rag_questions),
        )  # fmt: skip
        return
    for given, option in ((documents, "--documents"), (rag_records, "--rag-records")):
        if given is not None:
            raise typer.BadParameter(f"{option} goes with --pairs", param_hint=f"'{option}'")
    if name is None:
        print("packaged configs: " + ", ".join(pipeline_examples()))
        print("next: synthgen pipeline init NAME, or synthgen pipeline init --pairs FILE")
        return
    try:
        path = copy_pipeline_example(name, to, force=force)
    except UnknownConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="'NAME'") from exc
    print(f"wrote {path}")
    print(f"next: synthgen pipeline --config {shlex.quote(str(path))}")


def _init_pairs(name, to, force, pairs, documents, preset, fields, rag) -> None:
    """`init --pairs`: a config for the user's pairs (`dpsynth.pipeline.pairs_config`)."""
    from dpsynth.pipeline.pairs_config import PRESETS, pairs_config_text
    from synthgen.user_pairs import PairsFileError, PairsSource

    if preset not in PRESETS:
        raise typer.BadParameter(f"one of {', '.join(PRESETS)}", param_hint="'--preset'")
    label = name or pairs.stem
    destination = Path(to).expanduser() if to is not None else Path(f"{label}.py")
    if destination.is_dir():
        destination = destination / f"{label}.py"
    if destination.exists() and not force:
        raise typer.BadParameter(f"{destination} exists; pass --force to overwrite it")
    query, document, doc_id, text, id_ = fields
    source = PairsSource(
        str(pairs), None if documents is None else str(documents), query_field=query,
        document_field=document, doc_id_field=doc_id, text_field=text, id_field=id_,
    )  # fmt: skip
    with refusals(PairsFileError, ValueError):
        written, plan = pairs_config_text(
            source, preset=preset, name=label, config_name=str(destination),
            rag_records=None if rag[0] is None else str(rag[0]),
            rag_questions=None if rag[1] is None else str(rag[1]),
        )  # fmt: skip
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(written)
    print(
        f"wrote {destination}: {plan.pairs} pairs naming {plan.documents_named} documents "
        f"({plan.train_pairs} to train on), {plan.documents_indexed} documents indexed"
    )
    if plan.rag_questions:
        print(
            f"DP-RAG: {plan.rag_questions} of your {plan.rag_questions_given} questions over "
            f"{plan.rag_records} private records (as many as the rag scope's cap fits)"
        )
    print(f"next: synthgen pipeline --config {shlex.quote(str(destination))}")


ShardOption = Annotated[
    str | None,
    typer.Option(
        help="I/N: run shard I of N only (0-based) into the run's shards/ folder; a later run "
        "without --shard joins the N shards"
    ),
]
RecomputeOption = Annotated[bool, typer.Option(help="recompute even if up to date")]


def _stage_command(name: str):
    """Stage `name`'s command: the first 4 options of `command` for most stages, --shard
    too for the stages that shard (index, generate), and --train-only for generate."""

    def command(
        config: ConfigOption = None,
        out: OutOption = None,
        force: RecomputeOption = False,
        progress: ProgressOption = True,
        shard: ShardOption = None,
        train_only: Annotated[
            bool,
            typer.Option(help="train (and charge) the DP generator only; the shards come next"),
        ] = False,
    ) -> None:
        _run(name, config, out, force=force, progress=progress, shard=shard, train_only=train_only)

    # typer reads the options from the signature: the options a stage lacks are cut off it
    signature = inspect.signature(command, eval_str=True)
    kept = list(signature.parameters.values())[: {"generate": 6, "index": 5}.get(name, 4)]
    command.__signature__ = signature.replace(parameters=kept)
    command.__doc__ = STAGE_HELP[name]
    return command


def _run(name, config, out, *, force, progress, shard=None, train_only=False) -> None:
    from dpsynth.pipeline import RunFolder, run_stage
    from dpsynth.pipeline.runner import run_shard
    from synthgen.command_line import parse_shard

    part = parse_shard(shard)
    _bars(progress)
    if part is not None and (force or train_only):
        raise typer.BadParameter(
            "--shard runs one shard; --force and --train-only belong to the stage itself",
            param_hint="--shard",
        )
    cfg = _load(config)
    run = RunFolder(Path(out or cfg.out))
    run.root.mkdir(parents=True, exist_ok=True)
    if part is not None:
        done = run_shard(name, cfg, run, part, progress=progress)
        print(f"{name} shard {done['shard']}: done ({done['seconds']:.1f} s) in {done['folder']}")
        return
    record = run_stage(name, cfg, run, force=force, progress=progress, train_only=train_only)
    print(f"{name}: {record['status']} ({record.get('seconds', 0):.1f} s) in {run.root}")


for _name in STAGE_HELP:
    pipeline_app.command(_name)(_stage_command(_name))
