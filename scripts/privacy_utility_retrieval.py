"""Privacy-utility of retrieval on wiki-summaries-en (Carranza et al. 2023, Tables 3-4, small).

Query = short description, document = lead paragraph; a fixed split by document
(`synthgen.corpora.split_by_document`), every test document stays in the corpus. Cells:

* zero-shot: the pretrained encoder, no training;
* real (epsilon = inf): in-batch softmax on the real train pairs, no DP;
* direct DP at each epsilon: `retriever.train.train_retriever_dp` on the real train pairs;
* synthetic at each epsilon (and inf): a query generator (SmolLM2-135M + LoRA, DP-Adafactor;
  inf = the same run with noise_multiplier 0) fine-tuned on the real train pairs, one
  synthetic query per train document, then in-batch softmax on the synthetic pairs.

All trained retrievers use the same encoder, token budgets and evaluation (NDCG@10,
Recall@10 on the test queries, exact search). Each cell is a separate, alternative release of
the same private data, charged to its own ledger scope in `<out>/ledger.sqlite` (the cells
are not composed: a user would deploy one of them). Each finished cell is cached in
`<out>/cells/<name>.json`; rerunning resumes. The DP runs keep their secret resume state
(noise key, sampler state) in `<out>/work/<cell>`, deleted when the cell's release is
written; the released models and generators hold no secret randomness. Writes
`<out>/results.json` and `<out>/privacy_utility.png`.

    python scripts/privacy_utility_retrieval.py --out runs/privacy_utility   # ~1 h on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from retriever.encoders import load_encoder
from retriever.evaluate import evaluate
from retriever.train import RetrieverConfig, train_retriever, train_retriever_dp
from synthgen import corpora, dp_train, querygen
from synthgen.config_files import querygen_preset
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope


def _cell(out: Path, name: str, run) -> dict:
    path = out / "cells" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    start = time.time()
    result = run()
    result.update(cell=name, seconds=round(time.time() - start, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"[{name}] " + json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/privacy_utility"))
    parser.add_argument("--docs", type=int, default=2000, help="first N wiki documents")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[3.0, 8.0, 16.0])
    parser.add_argument("--encoder", default="all-minilm-l6-v2")
    parser.add_argument(
        "--generator",
        default="smollm2_lora_cpu",
        help="querygen preset: a name in synthgen/configs/querygen.py or path/to/file.py:NAME",
    )
    parser.add_argument("--generator-steps", type=int, default=25)
    parser.add_argument("--retriever-epochs", type=float, default=1.0)
    parser.add_argument("--dp-epochs", type=float, default=3.0)
    parser.add_argument("--max-doc-len", type=int, default=64)
    parser.add_argument(
        "--report-only", action="store_true", help="table and plot from the finished cells"
    )
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        order = ["zero-shot", "real", "synthetic-inf"]
        cells = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
        cells.sort(
            key=lambda c: (
                order.index(c["cell"]) if c["cell"] in order else 9,
                c["cell"].split("-")[0],
                c["epsilon"] or 0,
            )
        )
        report(cells, out)
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

    def score(encoder) -> dict:
        report = evaluate(encoder, doc_ids, texts, test_rows, max_doc_len=args.max_doc_len)
        return {k: report[k] for k in ("ndcg@10", "recall@10", "mrr@10", "num_queries")}

    def scope(name: str, plan: dp_train.PrivacyPlan) -> tuple[str, str]:
        key = ("privacy-utility", name)
        cap = plan.epsilon * (1 + 1e-6)
        ledger.ensure_scope(Scope(*key, cap, delta, relation=plan.relation))
        return key

    cells = [_cell(out, "zero-shot", lambda: {"epsilon": None, **score(base)})]

    def real():
        result = train_retriever(
            base,
            train["query"],
            train["document"],
            rconfig,
            doc_ids=train["doc_id"],
            out_dir=out / "models" / "real",
        )
        return {
            "epsilon": math.inf,
            "pairs_per_second": result.pairs_per_second,
            **score(str(out / "models" / "real")),
        }

    cells.append(_cell(out, "real", real))

    row_of = {d: i for i, d in enumerate(doc_ids)}
    for eps in args.epsilons:

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
                ledger=ledger,
                ledger_scope=scope(f"direct-dp-{eps:g}", plan),
                work_dir=out / "work" / f"direct-dp-{eps:g}",
                plan=plan,
            )
            return {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier,
                **score(str(model)),
            }

        cells.append(_cell(out, f"direct-dp-{eps:g}", direct_dp))

    preset = querygen_preset(args.generator)
    gen_epochs = args.generator_steps * preset.dp.batch_size / n
    for eps in [*args.epsilons, math.inf]:
        name = "synthetic-inf" if math.isinf(eps) else f"synthetic-{eps:g}"

        def synthetic(eps=eps, name=name):
            noise = (
                dict(dp_target_epsilon=None, dp_noise_multiplier=0.0)
                if math.isinf(eps)
                else dict(dp_target_epsilon=eps)
            )
            config = preset.replace(dp_epochs=gen_epochs, generation_batch=32, **noise)
            gen_dir = out / "generators" / name
            plan = dp_train.plan_privacy(config.dp, n)
            querygen.train_generator(
                config,
                train,
                gen_dir,
                ledger=ledger if plan.private else None,
                ledger_scope=scope(name, plan) if plan.private else None,
                work_dir=out / "work" / name,
                plan=plan,
            )
            synth = querygen.generate_queries(gen_dir, train, out / "synthetic" / name)
            keep = [i for i, q in enumerate(synth["query"]) if q.strip()]
            model = out / "models" / name
            train_retriever(
                base,
                [synth["query"][i] for i in keep],
                [synth["document"][i] for i in keep],
                rconfig,
                doc_ids=[synth["doc_id"][i] for i in keep],
                out_dir=model,
            )
            return {
                "epsilon": plan.epsilon,
                "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier,
                "synthetic_pairs": len(keep),
                **score(str(model)),
            }

        cells.append(_cell(out, name, synthetic))

    report(cells, out)


def report(cells: list[dict], out: Path) -> None:
    """Writes results.json and the plot; prints a markdown table."""
    (out / "results.json").write_text(json.dumps(cells, indent=1))
    plot(cells, out / "privacy_utility.png")
    print("| cell | epsilon | NDCG@10 | Recall@10 | MRR@10 |\n|---|---|---|---|---|")
    for c in cells:
        eps = "-" if c["epsilon"] is None else f"{c['epsilon']:.3g}"
        print(
            f"| {c['cell']} | {eps} | {c['ndcg@10']:.4f} | {c['recall@10']:.4f} | "
            f"{c['mrr@10']:.4f} |"
        )


def plot(cells: list[dict], path: Path) -> None:
    """NDCG@10 against epsilon: synthetic and direct-DP curves, zero-shot and real lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {c["cell"]: c for c in cells}
    fig, ax = plt.subplots(figsize=(6, 4))
    for prefix, label, marker in (
        ("synthetic-", "DP synthetic queries", "o"),
        ("direct-dp-", "direct DP training", "s"),
    ):
        pts = sorted(
            (c["epsilon"], c["ndcg@10"])
            for n, c in by.items()
            if n.startswith(prefix) and not math.isinf(c["epsilon"])
        )
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)
    for name, style, label in (
        ("real", "--", "real queries, no DP"),
        ("synthetic-inf", ":", "synthetic, non-private generator"),
        ("zero-shot", "-.", "zero-shot encoder"),
    ):
        if name in by:
            ax.axhline(by[name]["ndcg@10"], linestyle=style, color="gray", label=label)
    ax.set_xlabel("epsilon (delta = 1/(2n))")
    ax.set_ylabel("NDCG@10 on held-out real queries")
    ax.set_title("wiki-summaries-en: retrieval utility vs privacy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
