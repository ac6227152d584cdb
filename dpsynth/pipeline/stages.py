"""The main job's data and generate stages: each reads the previous stages' folders and returns
a public summary (the retrieval, rag and report stages have their own modules; `runner`
lists them all).

Summaries hold counts, epsilons, metrics and timings only: never a private query or
document, never a training loss (computed on private data and not DP).

Privacy:
  Privacy unit of the pairs: one (document, query) pair of the train split (add/remove-one);
  documents are public, queries private. The generate stage is the only release computed
  from the private pairs, charged before training starts; the encoder, the index and the
  synthetic queries are post-processing of it. The rag stage's answers are charged per
  answer (`rag_stage`). The evaluate stage and the real-data upper bound read real queries:
  their figures are not DP and are shown to the operator only.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth.pipeline.context import (
    StageContext,
    StageNotReadyError,
    fingerprints,
    open_run_scope,
)
from dpsynth.pipeline.stage_shards import finished_shards, remove_shards
from synthgen.corpora import read_jsonl
from synthgen.privacy.figures import format_epsilon, round_up
from synthgen.work_folder import private_folder

PAIRS_DATASET = "train-pairs"
# A user's pairs: the public documents the generator writes queries for (data stage)
TARGETS_FILE = "targets.jsonl"


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def data_stage(ctx: StageContext) -> dict:
    """Loads the private pairs (the wiki summaries, or the user's `data.pairs`) and splits
    them by document (a public, seeded split).

    Writes the public corpus to `data/corpus.jsonl` and the private train pairs and held-out
    real queries to `private/data/`. A user's pairs file is checked line by line first
    (`synthgen.user_pairs`): a bad file stops the run here, before any charge.
    """
    cfg = ctx.config.data
    root, private = ctx.run.root, ctx.run.private
    if cfg.pairs is not None:
        corpus, train, test, targets = _user_pairs(cfg, ctx.config.seed)
        _write_jsonl(root / "data" / TARGETS_FILE, targets)  # public: collection and seed
    else:
        corpus, train, test = _wiki_pairs(cfg, ctx.config.seed)
    private_folder(private / "data")  # owner only, as every folder of the private tree
    _write_jsonl(root / "data" / "corpus.jsonl", corpus)
    _write_jsonl(
        private / "data" / "train_pairs.jsonl",
        ({"doc_id": r["doc_id"], "document": r["document"], "query": r["query"]} for r in train),
    )
    _write_jsonl(
        private / "data" / "test_queries.jsonl",
        ({"doc_id": r["doc_id"], "query": r["query"]} for r in test),
    )
    ctx.log("data", f"{len(corpus)} documents: {len(train)} train pairs, {len(test)} held out")
    return {"documents": len(corpus), "train_pairs": len(train), "test_queries": len(test)}


def _wiki_pairs(cfg, seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    from synthgen import corpora

    wiki = corpora.load_wiki_summaries(cfg.source, limit=cfg.num_documents)
    train, test = corpora.split_by_document(wiki, test_fraction=cfg.test_fraction, seed=seed)
    corpus = [{"doc_id": r["doc_id"], "text": r["document"], "title": r["title"]} for r in wiki]
    return corpus, list(train), list(test)


def _user_pairs(cfg, seed: int):
    """(corpus, train pairs, held-out pairs, targets) of the user's files: the public
    collection indexed whole (its first `num_documents` documents when set), split by its
    own ids (`synthgen.user_pairs.split_collection`)."""
    from synthgen.user_pairs import read_pairs, split_collection

    collection, pairs = read_pairs(cfg.pairs_source())
    if cfg.num_documents is not None:  # the collection's first N documents (public order)
        collection = collection[: cfg.num_documents]
        kept = {d["doc_id"] for d in collection}
        pairs = [p for p in pairs if p["doc_id"] in kept]
    train, test, targets = split_collection(
        collection, pairs, test_fraction=cfg.test_fraction, seed=seed
    )
    if not train or not test:
        raise ValueError(
            f"{cfg.pairs}: {len(train)} train pairs and {len(test)} held-out queries after the "
            "split by document: need both (more pairs, or another data.test_fraction)"
        )
    return collection, train, test, targets


def _admit_pairs(
    ctx: StageContext,
    pairs: list[dict],
    plan,
    *,
    stage: str,
    n: int,
    delta: float,
    check: bool,
    quiet: bool = False,
):
    """The ledger and the private pairs' scope, admitted as every command admits a
    collection (`synthgen.privacy.admission.admit`: the pairs bound to their name, the scope
    opened with the run's caps, the notices logged unless `quiet`). `n`: the count the delta
    warning uses (the few-shot generator's declared pool size, not the private count);
    `delta`: the scope's delta cap (`_querygen_plan`, `_fewshot_plan`)."""
    from synthgen.privacy.admission import admit
    from synthgen.privacy.ledger import PrivacyLedger

    privacy = ctx.config.privacy
    ledger = PrivacyLedger(ctx.run.ledger)
    records = [{"document": r["document"], "query": r["query"]} for r in pairs]
    scope = admit(
        ledger, privacy.tenant, PAIRS_DATASET, records, plan, stage=stage, public_count=n,
        budget=privacy.epsilon_cap, delta=delta, check=check, open_scope=open_run_scope,
        option=None,
        tell=lambda lines: None if quiet else [ctx.log("generate", line) for line in lines],
    )  # fmt: skip
    return ledger, scope


def _querygen_plan(ctx: StageContext, n: int):
    from synthgen import dp_train

    delta = ctx.config.privacy.delta or 1 / (2 * n)
    config = ctx.config.generate.querygen.replace(dp_delta=delta)
    return config, dp_train.plan_privacy(config.dp, n), delta


def generate_precheck(ctx: StageContext) -> None:
    """Refuses a new generate run whose charge would not fit the pairs' scope, before the
    runner removes the previous release (a refused request changes nothing)."""
    from synthgen.privacy.notices import new_ledger_warning

    path = ctx.run.private / "data" / "train_pairs.jsonl"
    if not path.is_file():
        return
    pairs = read_jsonl(path)
    if ctx.config.generate.kind == "querygen":
        _, plan, delta = _querygen_plan(ctx, len(pairs))
        stage = "dp-train"
    else:
        _, _, plan, delta = _fewshot_plan(ctx, pairs)
        stage = "fewshot-generate"
    ledger, _ = _admit_pairs(
        ctx, pairs, plan, stage=stage, n=len(pairs), delta=delta, check=True, quiet=True
    )
    # the first to open a fresh run's ledger: the stage itself then names its location
    warning = new_ledger_warning(ledger, PAIRS_DATASET, option=None)
    if warning:
        ctx.log("generate", warning)


def _fewshot_plan(ctx: StageContext, pairs: list[dict]):
    """(private rows, target rows, plan, delta) of the few-shot generate run."""
    from synthgen import fewshot

    cfg = ctx.config.generate
    private = [{"document": r["document"], "query": r["query"]} for r in pairs]
    targets = list(_target_documents(ctx, pairs))
    plan = fewshot.plan_for(private, targets, fewshot.QUERY_TEMPLATE, cfg.fewshot)
    return private, targets, plan, max(ctx.config.privacy.delta or 0.0, plan.delta)


def _target_documents(ctx: StageContext, pairs: list[dict]):
    """The public documents the generate stage writes queries for, as a Dataset."""
    import datasets

    cfg = ctx.config.generate
    public = ctx.run.root / "data" / TARGETS_FILE
    if ctx.config.data.pairs is not None:  # a user's pairs: the public targets, never the pairs'
        rows = read_jsonl(public)
    else:  # the wiki summaries: one pair per document, every document public
        rows = [{"doc_id": r["doc_id"], "document": r["document"]} for r in pairs]
    chosen = rows if cfg.synthetic_documents is None else rows[: cfg.synthetic_documents]
    return datasets.Dataset.from_list(
        [{"doc_id": r["doc_id"], "document": r["document"]} for r in chosen]
    )


def check_shardable(config, what: str) -> None:
    """Refuses `what` (--shard, --train-only) for a few-shot generate stage."""
    if config.generate.kind != "querygen":
        raise ValueError(
            f"{what} applies to the fine-tuned generator (generate.kind='querygen'); the "
            "few-shot generator releases every token by a DP vote and runs as one job"
        )


def _sampling_seed(ctx: StageContext) -> int:
    """The queries' sampling seed: 128 bits of OS entropy drawn once per generate run and kept
    in the private work folder until the stage ends, so that a resumed run and every shard
    (`stage_shards`) draw from one stream. Sampling from the released generator is
    post-processing; the seed is kept private all the same, as all randomness is."""
    import secrets

    from synthgen.run_seed import SEED_BITS

    path = ctx.run.private / "work" / "generate-sampling" / "seed.json"
    if path.is_file():
        return int(json.loads(path.read_text())["seed"])
    seed = secrets.randbits(SEED_BITS)
    private_folder(path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seed": str(seed)}))
    tmp.replace(path)
    return seed


def generate_shard(ctx: StageContext, shard, out: Path) -> dict:
    """Shard `shard`'s synthetic queries into `out`, from the generator that
    `synthgen pipeline generate --train-only` trained under this config (`stage_shards`)."""
    from synthgen import querygen

    check_shardable(ctx.config, "--shard")
    record = ctx.run.record("generate")
    trained = (
        record is not None
        and record["fingerprint"] == fingerprints(ctx.config)["generate"]
        and record["status"] == "running"
        and (ctx.run.root / "generator" / querygen.GENERATOR_FILE).is_file()
        and (ctx.run.private / "work" / "generate-sampling" / "seed.json").is_file()
    )
    if not trained:
        raise StageNotReadyError(
            "the generator is not trained under this config: run `synthgen pipeline generate "
            "--train-only` first (one job, charged once), then the shards"
        )
    pairs = read_jsonl(ctx.run.private / "data" / "train_pairs.jsonl")
    documents = _target_documents(ctx, pairs)
    rows = querygen.generate_queries(
        ctx.run.root / "generator",
        documents,
        out,
        seed=_sampling_seed(ctx),
        shard=shard,
        progress=ctx.progress,
    )
    return {"documents": len(set(rows["doc_id"])), "queries": len(rows)}


def generate_stage(ctx: StageContext) -> dict:
    """DP synthetic queries for the train documents (fine-tuned or few-shot generator)."""
    cfg = ctx.config.generate
    pairs = read_jsonl(ctx.run.private / "data" / "train_pairs.jsonl")
    documents = _target_documents(ctx, pairs)
    if cfg.kind == "querygen":
        summary = _querygen(ctx, pairs, documents)
        if ctx.train_only:
            return summary
    else:
        summary = _fewshot(ctx, pairs)
    rows = read_jsonl(ctx.run.root / "synthetic" / "queries.jsonl")
    summary.update(
        kind=cfg.kind,
        private_pairs=len(pairs),
        synthetic_documents=len(documents),
        synthetic_queries=sum(1 for r in rows if r["query"].strip()),
        empty_queries=sum(1 for r in rows if not r["query"].strip()),
    )
    return summary


def _querygen(ctx: StageContext, pairs: list[dict], documents) -> dict:
    import datasets

    from synthgen import querygen
    from synthgen.work_folder import WorkFolder

    n = len(pairs)
    config, plan, delta = _querygen_plan(ctx, n)
    # the run checks its budget through its work folder, which knows a resume
    ledger, scope = _admit_pairs(ctx, pairs, plan, stage="dp-train", n=n, delta=delta, check=False)
    ctx.log(
        "generate",
        f"DP fine-tuning {config.base} ({config.family}, LoRA rank {config.lora_rank}) on {n} "
        f"private pairs: epsilon={format_epsilon(plan.epsilon)} "
        f"delta={round_up(plan.delta, 3):.2e} sigma={plan.noise_multiplier:.3f} steps={plan.steps}",
    )
    train = datasets.Dataset.from_list(pairs)
    work = ctx.run.private / "work" / "generate"
    seed = _sampling_seed(ctx)  # drawn before training: the shards read it
    if (ctx.run.root / "generator" / querygen.GENERATOR_FILE).is_file():
        # Trained earlier in this stage run (the runner removes the generator whenever the
        # stage starts afresh), and charged to this run's ledger: a crash while sampling, or
        # `--train-only` before the shards. The generator is not touched again, so the shards
        # read one generator and a run folder moved after training still finishes.
        if not WorkFolder(work).charged_in(ledger, scope, plan):
            raise ValueError(
                f"{ctx.run.root / 'generator'} holds a generator whose charge for this config "
                "is not in the run's ledger: recompute the stage (`synthgen pipeline generate "
                "--force`)"
            )
        ctx.log("generate", "the generator is trained; sampling its queries")
        steps_run = resumed_from = plan.steps
    else:
        # keep_work: the work folder holds the charge's record until the whole stage is done.
        result = querygen.train_generator(
            config,
            train,
            ctx.run.root / "generator",
            pay=WorkFolder(work).payer(ledger, scope, stage="dp-train"),
            keep_work=True,
            progress=ctx.progress,
            plan=plan,
        )
        steps_run, resumed_from = result.steps_run, result.resumed_from
    summary = {
        "generator": f"DP fine-tuned {config.base} ({config.family})",
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": plan.steps,
        "steps_run": steps_run,
        "resumed_from_step": resumed_from,
        "accountant": plan.accountant,
        "relation": plan.relation.name,
    }
    if ctx.train_only:
        ctx.log(
            "generate",
            "generator trained; next: `synthgen pipeline generate --shard I/N` for each shard, "
            "then `synthgen pipeline generate` to join them",
        )
        return summary
    shards = _finished_query_shards(ctx, seed)
    if shards:
        ctx.log("generate", f"joining {len(shards)} query shards")
        querygen.merge_query_shards(shards, ctx.run.root / "synthetic")
        summary["shards"] = len(shards)
    else:
        querygen.generate_queries(
            ctx.run.root / "generator",
            documents,
            ctx.run.root / "synthetic",
            seed=seed,
            progress=ctx.progress,
        )
    # The shards are joined; the secret resume state and the sampling seed go once the
    # runner has recorded the stage as done (`context.STAGE_SECRETS`).
    remove_shards(ctx.run.root, "generate")
    return summary


def _finished_query_shards(ctx: StageContext, seed: int) -> list[Path]:
    """This run's finished query shards ([] if none), checked against its generator and seed
    (`querygen.merge_query_shards` checks that they agree with each other)."""
    import hashlib

    from synthgen import querygen
    from synthgen.corpora import file_sha256

    shards = finished_shards(ctx.run.root, "generate", fingerprints(ctx.config)["generate"])
    generator = file_sha256(ctx.run.root / "generator" / querygen.PARAMS_FILE)
    seed_hash = hashlib.sha256(str(seed).encode()).hexdigest()
    for folder in shards:
        record = json.loads((folder / "metadata.json").read_text()).get("shard", {})
        if (record.get("generator_sha256"), record.get("seed_sha256")) != (generator, seed_hash):
            raise ValueError(
                f"{folder} was sampled from another generator or seed than this run's: remove "
                f"{folder.parent} and run the shards again"
            )
    return shards


def _fewshot(ctx: StageContext, pairs: list[dict]) -> dict:
    from synthgen import fewshot
    from synthgen.lm_backends import FlaxLM
    from synthgen.privacy import secure_rng
    from synthgen.privacy.receipts import ledger_payer

    cfg = ctx.config.generate
    private, targets, plan, delta = _fewshot_plan(ctx, pairs)
    ledger, scope = _admit_pairs(
        ctx, pairs, plan, stage="fewshot-generate", n=plan.public_pool_size * plan.pools,
        delta=delta, check=True,
    )  # fmt: skip
    ctx.log(
        "generate",
        f"DP few-shot queries with {cfg.fewshot_model}: epsilon={format_epsilon(plan.epsilon)} "
        f"delta={round_up(plan.delta, 3):.2e} over {len(targets)} documents",
    )
    lm = FlaxLM.load(cfg.fewshot_model)
    result = fewshot.generate(
        lm,
        private,
        targets,
        fewshot.QUERY_TEMPLATE,
        cfg.fewshot,
        rng=secure_rng(),
        pay=ledger_payer(ledger, scope, stage="fewshot-generate"),
        plan=plan,
    )
    fewshot.write_output(
        str(ctx.run.root / "synthetic"),
        {
            "doc_id": [t["doc_id"] for t in targets],
            "document": [t["document"] for t in targets],
            "query": [text.strip().split("\n")[0] for text in result.texts],
        },
        result,
        cfg.fewshot,
        model=cfg.fewshot_model,
        template=fewshot.QUERY_TEMPLATE,
        name="queries",
    )
    return {
        "generator": f"DP few-shot {cfg.fewshot_model}",
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "accountant": "pld",
        "relation": fewshot.RELATION,
    }
