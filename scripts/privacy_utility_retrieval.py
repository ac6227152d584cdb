"""Privacy-utility of retrieval on wiki-summaries-en (Carranza et al. 2023, Tables 3-4, small).

Query = short description, document = lead paragraph; a fixed split by document
(`synthgen.corpora.split_by_document`), every test document stays in the corpus. Cells:

* zero-shot: the pretrained encoder, no training;
* real (epsilon = inf): in-batch softmax on the real train pairs, no DP;
* direct DP at each epsilon: `retriever.train.train_retriever_dp` on the real train pairs;
* synthetic at each epsilon (and inf): a query generator (SmolLM2-135M + LoRA, DP-Adafactor;
  inf = the same run with noise_multiplier 0) fine-tuned on the real train pairs, one
  synthetic query per train document, then in-batch softmax on the synthetic pairs;
* synthetic at each epsilon with the levers that cost no privacy (issue 37), each alone
  (``+filter``, ``+multi``, ``+negatives``) and all together (``+all``), on the same DP
  generator as the plain synthetic cell (post-processing of one release):
  ``multi`` samples `--queries-per-doc` queries per document (and drops repeats),
  ``filter`` keeps a query when the zero-shot encoder ranks its document in the top
  `--filter-k` of the corpus (`retriever.consistency`), ``negatives`` adds one hard negative
  per pair mined with the zero-shot encoder (`retriever.negatives`). The lever settings are
  fixed in advance, not tuned on the test queries (which are private too).

All trained retrievers use the same encoder, token budgets and evaluation (NDCG@10,
Recall@10 and MRR@10, exact search). The held-out real queries are halved once, by a fixed
public permutation (`retriever.metrics.validation_split`; the figures in
`retriever.utility_cells`): settings are chosen on the validation half and every reported
figure is the test half's, with a percentile-bootstrap 95% interval over its queries. Each
DP generator is a separate, alternative release of the same private data, charged to its own
ledger scope in `<out>/ledger.sqlite` (the cells are not composed: a user would deploy one
of them). Each finished cell is cached in
`<out>/cells/<name>.json` (with per-query values: operator-only), each generator and query
set on disk; rerunning resumes. The DP runs keep their secret resume state (noise key,
sampler state) in `<out>/work/<cell>`, deleted when the cell's release is written; the
released models and generators hold no secret randomness. Writes `<out>/results.json`
(intervals, no per-query values) and `<out>/privacy_utility.png`. The last line is exactly
``share_of_real_gain_eps1=<v> full_corpus_share_eps1=<v> holdout_ndcg=<v>``: the headline
epsilon-1 cell's share of the real queries' gain over zero-shot on the test queries,
(NDCG - zero-shot) / (real - zero-shot), here and in the `--full-corpus-out` run (nan
without one), and `--holdout-ndcg` as measured separately (nan without). The headline cell
is the epsilon-1 synthetic cell (plain or with levers) with the best validation NDCG@10
(``--headline auto``), or one named in advance.

    python scripts/privacy_utility_retrieval.py --out runs/privacy_utility   # hours on 2 cores
    python scripts/privacy_utility_retrieval.py --docs 9862 --out runs/pu_full --epsilons 1
    python scripts/privacy_utility_retrieval.py --replot docs/privacy_utility.json  # the PNG
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

from dpsynth.config_files import querygen_preset
from retriever.consistency import ConsistencyFilter, dedupe_pairs, filter_pairs
from retriever.encoders import load_encoder
from retriever.evaluate import evaluate
from retriever.metrics import bootstrap_interval
from retriever.negatives import NegativeMining, mine_hard_negatives
from retriever.train import RetrieverConfig, train_retriever, train_retriever_dp
from retriever.utility_cells import (
    LEVERS,
    METRICS,
    cell_name,
    gain_share,
    headline_share,
    lever_rank,
    levers_of,
    paired_difference,
    split_figures,
)
from synthgen import corpora, dp_train, querygen
from synthgen.plots import pyplot
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.work_folder import run_payer


def _cell(out: Path, name: str, run, settings: dict) -> dict:
    """The cached cell `name`, or `run()`'s result cached; refuses a cell cached under other
    settings (another --docs, lever setting, schedule or encoder)."""
    path = out / "cells" / f"{name}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("settings") != settings:
            raise SystemExit(
                f"{path} was made with other settings ({cached.get('settings')}): use another "
                "--out, or remove the cell to recompute it"
            )
        return cached
    start = time.time()
    result = run()
    result.update(cell=name, seconds=round(time.time() - start, 1), settings=settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    shown = {k: v for k, v in result.items() if k != "per_query"}
    print(f"[{name}] " + json.dumps(shown), flush=True)
    return result


def _load_cells(out: Path) -> list[dict]:
    """The finished cells in table order: zero-shot, real, direct DP, synthetic by epsilon, each
    epsilon's plain cell first, then one lever, two, and ``+all``."""
    cells = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    kinds = ("zero-shot", "real", "direct-dp", "synthetic")

    def order(c: dict) -> tuple:
        kind = next(i for i, k in enumerate(kinds) if c["cell"].startswith(k))
        eps = math.inf if c["epsilon"] is None else c["epsilon"]
        return kind, eps, lever_rank(c["cell"]), c["cell"]

    return sorted(cells, key=order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/privacy_utility"))
    parser.add_argument("--docs", type=int, default=2000, help="first N wiki documents")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    parser.add_argument("--encoder", default="all-minilm-l6-v2")
    parser.add_argument(
        "--generator",
        default="smollm2_lora_cpu",
        help="querygen preset: a name in dpsynth/configs/querygen.py or path/to/file.py:NAME",
    )
    parser.add_argument("--generator-steps", type=int, default=25)
    parser.add_argument("--retriever-epochs", type=float, default=1.0)
    parser.add_argument("--dp-epochs", type=float, default=3.0)
    parser.add_argument("--max-doc-len", type=int, default=64)
    parser.add_argument("--skip-direct-dp", action="store_true", help="no direct-DP cells")
    parser.add_argument("--skip-nonprivate-generator", action="store_true")
    parser.add_argument(
        "--levers",
        nargs="*",
        default=list(LEVERS),
        choices=LEVERS,
        help="levers run one at a time at each epsilon (and all together if several)",
    )
    parser.add_argument(
        "--schedule-epochs",
        type=float,
        help="a schedule check: the real and each plain synthetic cell trained for this many "
        "epochs as well (cells real-e<E>, synthetic-<epsilon>-e<E>)",
    )
    parser.add_argument("--queries-per-doc", type=int, default=3, help="the multi lever")
    parser.add_argument("--filter-k", type=int, default=3, help="the filter lever's top k")
    parser.add_argument(
        "--headline",
        default="auto",
        help="the epsilon-1 cell of the last line: 'auto' = the one with the best NDCG@10 on "
        "the validation queries, or named in advance (a lever, 'all', 'none' for the plain "
        "synthetic cell); never chosen on the test queries",
    )
    parser.add_argument(
        "--full-corpus-out", type=Path, help="the whole-corpus run's --out, for the last line"
    )
    parser.add_argument(
        "--holdout-ndcg", type=float, help="the headline cell's NDCG@10 on the unseen domain"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="table and plot from the finished cells"
    )
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="only redraw the plot of a cells JSON (results.json, docs/privacy_utility.json) "
        "into the same path with .png; nothing is trained or evaluated",
    )
    args = parser.parse_args()
    if args.replot is not None:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(_load_cells(out), out, args)
        return

    wiki = corpora.load_wiki_summaries(limit=args.docs)
    train, test = corpora.split_by_document(wiki)
    doc_ids, texts = list(wiki["doc_id"]), list(wiki["document"])
    test_rows = [{"query": q, "doc_id": d} for q, d in zip(test["query"], test["doc_id"])]
    n = len(train)
    delta = 1 / (2 * n)
    ledger = PrivacyLedger(out / "ledger.sqlite")
    print(
        f"[data] {len(wiki)} documents, {n} train pairs, {len(test)} test queries, "
        f"delta={delta:.2e}"
    )

    rconfig = RetrieverConfig(epochs=args.retriever_epochs, max_doc_len=args.max_doc_len)
    base = load_encoder(args.encoder)
    settings = {
        k: getattr(args, k)
        for k in (
            "docs",
            "encoder",
            "generator",
            "generator_steps",
            "retriever_epochs",
            "dp_epochs",
            "max_doc_len",
            "queries_per_doc",
            "filter_k",
        )
    }

    def cell(name: str, run, **more_settings) -> dict:
        return _cell(out, name, run, {**settings, **more_settings})

    def score(encoder) -> dict:
        report = evaluate(
            encoder, doc_ids, texts, test_rows, max_doc_len=args.max_doc_len, per_query=True
        )
        out = {k: report[k] for k in (*METRICS, "num_queries")}
        out["per_query"] = report["per_query"]
        for k in METRICS:
            out[f"{k}_ci95"] = bootstrap_interval(lambda m: m, report["per_query"][k])
        return out

    def scope(name: str, plan: dp_train.PrivacyPlan) -> tuple[str, str]:
        key = ("privacy-utility", name)
        cap = plan.epsilon * (1 + 1e-6)
        ledger.ensure_scope(Scope(*key, cap, delta, relation=plan.relation))
        return key

    cells = [cell("zero-shot", lambda: {"epsilon": None, **score(base)})]

    def real(config=rconfig, name="real"):
        result = train_retriever(
            base,
            train["query"],
            train["document"],
            config,
            doc_ids=train["doc_id"],
            out_dir=out / "models" / name,
        )
        return {
            "epsilon": math.inf,
            "pairs_per_second": result.pairs_per_second,
            **score(str(out / "models" / name)),
        }

    cells.append(cell("real", real))
    schedule = None
    if args.schedule_epochs is not None:
        schedule = dataclasses.replace(rconfig, epochs=args.schedule_epochs)
        suffix = f"-e{args.schedule_epochs:g}"
        cells.append(
            cell(
                "real" + suffix,
                lambda: real(schedule, "real" + suffix),
                schedule_epochs=args.schedule_epochs,
            )
        )

    row_of = {d: i for i, d in enumerate(doc_ids)}
    for eps in [] if args.skip_direct_dp else args.epsilons:

        def direct_dp(eps=eps):
            dp_config = dp_train.DPConfig(
                batch_size=64,
                epochs=args.dp_epochs,
                clip_norm=1.0,
                learning_rate=1e-3,
                target_epsilon=eps,
                physical_batch=16,
                microbatch=8,
            )
            plan = dp_train.plan_privacy(dp_config, n)
            model = out / "models" / f"direct-dp-{eps:g}"
            train_retriever_dp(
                base,
                train["query"],
                [row_of[d] for d in train["doc_id"]],
                texts,
                rconfig,
                dp_config,
                out_dir=model,
                pay=run_payer(
                    ledger,
                    scope(f"direct-dp-{eps:g}", plan),
                    out_dir=model,
                    work_dir=out / "work" / f"direct-dp-{eps:g}",
                ),
                plan=plan,
            )
            return {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier,
                **score(str(model)),
            }

        cells.append(cell(f"direct-dp-{eps:g}", direct_dp))

    preset = querygen_preset(args.generator)
    gen_epochs = args.generator_steps * preset.dp.batch_size / n
    chosen = tuple(lever for lever in LEVERS if lever in args.levers)
    combos = [(lever,) for lever in chosen] + ([chosen] if len(chosen) > 1 else [])
    epsilons = [*args.epsilons] + ([] if args.skip_nonprivate_generator else [math.inf])
    for eps in epsilons:
        name = "synthetic-inf" if math.isinf(eps) else f"synthetic-{eps:g}"
        noise = (
            dict(dp_target_epsilon=None, dp_noise_multiplier=0.0)
            if math.isinf(eps)
            else dict(dp_target_epsilon=eps)
        )
        config = preset.replace(dp_epochs=gen_epochs, generation_batch=32, **noise)
        plan = dp_train.plan_privacy(config.dp, n)
        gen_dir = out / "generators" / name

        def generator(config=config, plan=plan, gen_dir=gen_dir, name=name) -> Path:
            """The cell's DP generator, trained (and charged) once for all its levers."""
            if not (gen_dir / querygen.GENERATOR_FILE).is_file():
                querygen.train_generator(
                    config,
                    train,
                    gen_dir,
                    pay=run_payer(
                        ledger, scope(name, plan), out_dir=gen_dir, work_dir=out / "work" / name
                    )
                    if plan.private
                    else None,
                    work_dir=out / "work" / name,
                    plan=plan,
                )
            return gen_dir

        def queries(per_doc: int, name=name, generator=generator) -> list[dict]:
            folder = out / "synthetic" / f"{name}-q{per_doc}"
            if not (folder / "metadata.json").is_file():
                querygen.generate_queries(generator(), train, folder, queries_per_doc=per_doc)
            return corpora.read_jsonl(folder / "queries.jsonl")

        def synthetic(levers=(), config=rconfig, model_name=None, plan=plan, queries=queries,
                      name=name) -> dict:  # fmt: skip
            per_doc = args.queries_per_doc if "multi" in levers else 1
            rows = [r for r in queries(per_doc) if r["query"].strip()]
            record: dict = {"levers": list(levers), "generated_pairs": len(rows)}
            if "filter" in levers:  # it drops empty and repeated pairs first
                flt = ConsistencyFilter(
                    k=args.filter_k, encoder=args.encoder, max_doc_len=args.max_doc_len
                )
                rows, record["filter"] = filter_pairs(rows, doc_ids, texts, flt)
            elif "multi" in levers:
                rows = dedupe_pairs(rows)
            negatives = ids = None
            if "negatives" in levers:
                mining = NegativeMining(encoder=args.encoder, max_doc_len=args.max_doc_len)
                ids, record["negatives"] = mine_hard_negatives(
                    [r["query"] for r in rows], [r["doc_id"] for r in rows], doc_ids, texts, mining
                )
                negatives = [None if i is None else texts[row_of[i]] for i in ids]
            model = out / "models" / (model_name or cell_name(name, levers))
            train_retriever(
                base,
                [r["query"] for r in rows],
                [r["document"] for r in rows],
                config,
                doc_ids=[r["doc_id"] for r in rows],
                hard_negatives=negatives,
                hard_negative_ids=ids,
                out_dir=model,
            )
            return {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier,
                "synthetic_pairs": len(rows),
                **record,
                **score(str(model)),
            }

        cells.append(cell(name, synthetic))
        if schedule is not None:
            trial = f"{name}-e{args.schedule_epochs:g}"
            cells.append(
                cell(
                    trial,
                    lambda trial=trial, f=synthetic: f(config=schedule, model_name=trial),
                    schedule_epochs=args.schedule_epochs,
                )
            )
        for levers in [] if math.isinf(eps) else combos:
            done = cell(cell_name(name, levers), lambda levers=levers, f=synthetic: f(levers))
            if done["levers"] != list(levers):  # a "+all" of an older run named fewer levers
                raise SystemExit(
                    f"{out}/cells/{done['cell']}.json was made with levers {done['levers']}, "
                    f"not {list(levers)}: remove it to recompute it"
                )
            cells.append(done)

    report(cells, out, args)


def report(cells: list[dict], out: Path, args) -> None:
    """Writes results.json (no per-query values) and the plot; prints a markdown table (the
    validation NDCG@10 that chooses, the test half's metrics with 95% intervals), each lever
    cell's paired difference from the plain cell of its epsilon, then the last line."""
    for c in cells:
        c.update(split_figures(c))
    public = [{k: v for k, v in c.items() if k != "per_query"} for c in cells]
    (out / "results.json").write_text(json.dumps(public, indent=1))
    plot(cells, out / "privacy_utility.png")
    print(
        "| cell | epsilon | pairs | validation NDCG@10 | test NDCG@10 | test Recall@10 | "
        "test MRR@10 |\n|---|---|---|---|---|---|---|"
    )
    for c in cells:
        eps = "-" if c["epsilon"] is None else f"{c['epsilon']:.3g}"
        figures = []
        for k in METRICS:
            lo, hi = c[f"test_{k}_ci95"]
            figures.append(f"{c[f'test_{k}']:.4f} [{lo:.4f}, {hi:.4f}]")
        pairs = c.get("synthetic_pairs", "-")
        print(
            f"| {c['cell']} | {eps} | {pairs} | {c['validation_ndcg@10']:.4f} | "
            + " | ".join(figures)
            + " |"
        )
    queries = cells[0]["validation_queries"], cells[0]["test_queries"]
    print(f"({queries[0]} validation and {queries[1]} test queries, a fixed public split)")
    rows = []
    for c in cells:
        plain, _, levers = c["cell"].partition("+")
        if c["cell"].startswith("synthetic-") and levers:
            diff = paired_difference(cells, c["cell"], plain)
            if diff is not None:
                figures = [f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}]" for d, (lo, hi) in diff.values()]
                rows.append(f"| {c['cell']} | {plain} | {' | '.join(figures)} |")
    if rows:
        print(
            "\n| cell | against | validation NDCG@10 difference | test NDCG@10 difference |\n"
            "|---|---|---|---|"
        )
        print("\n".join(rows))
        print("(paired: each bootstrap replicate resamples the queries once for both cells)")
    here = headline_share(cells, args.headline)
    if here is not None:
        name, value, (lo, hi) = here
        print(
            f"headline epsilon-1 cell ({args.headline}): {name}, share of the real gain on the "
            f"test queries {value:.3f} [{lo:.3f}, {hi:.3f}]"
        )
    for c in cells:
        if c["cell"].startswith("real-e"):
            trial = gain_share(cells, f"synthetic-1{c['cell'][4:]}", real=c["cell"])
            if trial is not None:
                name, value, (lo, hi) = trial
                print(
                    f"schedule check: {name}, share of {c['cell']}'s gain {value:.3f} "
                    f"[{lo:.3f}, {hi:.3f}]"
                )
    full = None
    if args.full_corpus_out is not None and (args.full_corpus_out / "cells").is_dir():
        full = headline_share(_load_cells(args.full_corpus_out), args.headline)
        if full is not None:
            print(
                f"whole corpus: {full[0]}, share {full[1]:.3f} [{full[2][0]:.3f}, {full[2][1]:.3f}]"
            )
    holdout = math.nan if args.holdout_ndcg is None else args.holdout_ndcg
    print(
        f"share_of_real_gain_eps1={math.nan if here is None else here[1]:.4f} "
        f"full_corpus_share_eps1={math.nan if full is None else full[1]:.4f} "
        f"holdout_ndcg={holdout:.4f}"
    )


def plot(cells: list[dict], path: Path) -> None:
    """NDCG@10 against epsilon: synthetic and direct-DP curves, zero-shot and real lines.

    The cells are this script's (`results.json`: the test half's ``test_ndcg@10``) or those
    of a run from before the validation split (`docs/privacy_utility.json`: ``ndcg@10`` on
    all the held-out queries). The y-limits hold every curve and line, so none sits on the
    frame.
    """
    plt = pyplot()

    by = {c["cell"]: c for c in cells}
    if all("test_ndcg@10" in c for c in cells):
        metric, ylabel = "test_ndcg@10", "NDCG@10 on the held-out test queries"
    else:
        metric = "ndcg@10"
        queries = {c.get("num_queries") for c in cells} - {None}
        held_out = f"{queries.pop()} held-out" if len(queries) == 1 else "the held-out"
        ylabel = f"NDCG@10 on {held_out} real queries"
    plotted: list[float] = []
    fig, ax = plt.subplots(figsize=(6, 4))
    combos = sorted(
        {levers_of(n[len("synthetic-") :]) for n in by if n.startswith("synthetic-")} - {None, ""},
        key=lever_rank,
    )
    curves = [("synthetic-", "", "DP synthetic queries", "o")]
    curves += [("synthetic-", c, f"DP synthetic, {c}", m) for c, m in zip(combos, "^<>v*Dph")]
    curves.append(("direct-dp-", "", "direct DP training", "s"))
    for prefix, suffix, label, marker in curves:
        pts = sorted(
            (c["epsilon"], c[metric])
            for n, c in by.items()
            if n.startswith(prefix)
            and levers_of(n[len(prefix) :]) == suffix
            and not math.isinf(c["epsilon"])
        )
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)
            plotted += [y for _, y in pts]
    for name, style, label in (
        ("real", "--", "real queries, no DP"),
        ("synthetic-inf", ":", "synthetic, non-private generator"),
        ("zero-shot", "-.", "zero-shot encoder"),
    ):
        if name in by:
            ax.axhline(by[name][metric], linestyle=style, color="gray", label=label)
            plotted.append(by[name][metric])
    if plotted:
        margin = max(0.08 * (max(plotted) - min(plotted)), 0.002)
        ax.set_ylim(min(plotted) - margin, max(plotted) + margin)
    ax.set_xlabel("epsilon (delta = 1/(2n))")
    ax.set_ylabel(ylabel)
    ax.set_title("wiki-summaries-en: retrieval utility vs privacy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
