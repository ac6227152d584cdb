"""`make demo`: the foundation end to end on real data, with every release on one ledger.

1. Load the wiki corpus from the offline asset and write the plain retrieval files
   (documents are public; the short descriptions play the private queries).
2. Two real DP releases about the private queries, each charged to the ledger first:
   a Laplace histogram of query topics, and a LimitedDomain top-1 of query first words.
3. Plan the DP fine-tuning of the query generator: calibrate sigma for a target epsilon.
4. DP query generator (Carranza et al. 2023): DP-fine-tune SmolLM2-135M-Instruct with LoRA
   on the train pairs at epsilon=8 (preset `smollm2_lora_cpu`), charged to the same ledger,
   then sample synthetic queries for held-out documents and print them next to the real ones
   (also written to `<out>/querygen/samples.md`).
5. Show the ledger and a refused over-budget request.

The pipeline stages (few-shot generator, retriever) extend this demo as they land.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
from pathlib import Path

import numpy as np

from configs import querygen as querygen_presets
from retriever import data
from synthgen import corpora, querygen
from synthgen.privacy import (
    BudgetExceededError,
    PrivacyLedger,
    Scope,
    accounting,
    laplace_mechanism,
    limited_domain_top1,
    secure_rng,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    parser.add_argument("--epsilon-cap", type=float, default=10.0)
    parser.add_argument("--generator-epsilon", type=float, default=8.0)
    parser.add_argument("--sample-docs", type=int, default=8, help="held-out docs to show")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    counts = data.export_wiki(args.out / "data")
    print(f"[data] wiki-summaries-en -> {args.out / 'data'}: {json.dumps(counts)}")
    private = corpora.load_jsonl(
        args.out / "data" / "train_queries.jsonl", required=("query", "doc_id")
    )
    corpus = {
        row["doc_id"]: row["topic"]
        for row in corpora.load_jsonl(args.out / "data" / "corpus.jsonl")
    }
    n = len(private)
    delta = 1 / (2 * n)

    ledger_path = args.out / "ledger.sqlite"
    ledger_path.unlink(missing_ok=True)
    ledger = PrivacyLedger(ledger_path)
    scope = ledger.open_scope(Scope("demo", "wiki-train-queries", args.epsilon_cap, delta))
    print(f"[ledger] {ledger_path}: cap epsilon={scope.epsilon_cap}, delta=1/(2n)={delta:.2e}")
    rng = secure_rng()

    # Release 1: topic histogram of the private queries. Unit: one (query, doc) pair, which
    # adds 1 to exactly one topic count -> L1 sensitivity 1 under add/remove-one.
    topics = sorted(set(corpus.values()))
    true_counts = collections.Counter(corpus[d] for d in private["doc_id"])
    ledger.charge(
        "demo",
        "wiki-train-queries",
        stage="demo-topic-histogram",
        event=accounting.laplace_event(0.5),
        relation="ADD_OR_REMOVE_ONE",
        description="Laplace, 12 topics",
    )
    noisy = laplace_mechanism(
        [true_counts[t] for t in topics], sensitivity=1.0, epsilon=0.5, rng=rng
    )
    print("[release] topic histogram of private queries (Laplace, epsilon=0.5):")
    for topic, value in zip(topics, noisy, strict=True):
        print(f"    {topic:30s} {value:8.1f}")

    # Release 2: the most common first word of the private queries, LimitedDomain top-1.
    # Unit: one query, which adds 1 to one word count (l0 = 1).
    words = collections.Counter(q.split()[0].lower() for q in private["query"] if q.split())
    vocab = sorted(words)
    eps2, delta2 = 0.5, delta / 10
    ledger.charge(
        "demo",
        "wiki-train-queries",
        stage="demo-top-first-word",
        event=accounting.epsilon_delta_event(eps2, delta2),
        relation="ADD_OR_REMOVE_ONE",
        description="LimitedDomain top-1, k_bar=20",
    )
    index = limited_domain_top1(
        np.array([words[w] for w in vocab], dtype=float),
        epsilon=eps2,
        delta=delta2,
        max_candidates=20,
        max_contributions=1,
        rng=rng,
    )
    print(
        f"[release] most common first word (LimitedDomain, epsilon={eps2}, "
        f"delta={delta2:.1e}): {vocab[index] if index is not None else '<none>'}"
    )

    # Plan: DP-Adafactor fine-tuning of the query generator on these pairs.
    batch, epochs = 256, 3
    steps = accounting.steps_for_epochs(n, batch, epochs)
    for target in (3.0, 8.0, 16.0):
        sigma = accounting.calibrate_noise_multiplier(
            target_epsilon=target, delta=delta, num_examples=n, batch_size=batch, steps=steps
        )
        rdp = accounting.dpsgd_epsilon(
            noise_multiplier=sigma,
            num_examples=n,
            batch_size=batch,
            steps=steps,
            delta=delta,
            accountant="rdp",
        )
        print(
            f"[plan] DP-SGD n={n} B={batch} epochs={epochs} steps={steps}: epsilon={target} "
            f"needs sigma={sigma:.3f} (PLD); RDP would state epsilon={rdp:.2f}"
        )

    run_query_generator(args, ledger)

    spend = ledger.spent("demo", "wiki-train-queries")
    print(
        f"[ledger] spent epsilon={spend.epsilon:.3f} at delta={spend.delta:.2e} over "
        f"{spend.num_charges} charges; remaining {spend.epsilon_remaining:.3f}"
    )
    try:
        ledger.charge(
            "demo",
            "wiki-train-queries",
            stage="demo-too-much",
            event=accounting.pure_epsilon_event(args.epsilon_cap),
            relation="ADD_OR_REMOVE_ONE",
        )
    except BudgetExceededError as err:
        print(f"[ledger] refused as expected: {err}")


def run_query_generator(args, ledger: PrivacyLedger) -> None:
    """Stage 4: DP fine-tuning on the train pairs, then queries for held-out documents."""
    wiki = corpora.load_wiki_summaries()
    train, test = corpora.split_by_document(wiki)  # the split `export_wiki` wrote above
    config = querygen_presets.get("smollm2_lora_cpu").replace(
        dp_target_epsilon=args.generator_epsilon
    )
    out = args.out / "querygen"
    # The demo's ledger is new on every run, so its generator starts fresh too (a work
    # folder charged to the old ledger would be refused).
    shutil.rmtree(out, ignore_errors=True)
    print(
        f"[querygen] DP-Adafactor LoRA fine-tuning of {config.base} on {len(train)} private "
        f"pairs, target epsilon={args.generator_epsilon} (preset smollm2_lora_cpu)"
    )
    # The release goes to out/generator; the secret resume state (noise key, sampler
    # state) to out/work, a private folder of this run, deleted once the release is written.
    result = querygen.train_generator(
        config,
        train,
        out / "generator",
        ledger=ledger,
        ledger_scope=("demo", "wiki-train-queries"),
        work_dir=out / "work",
    )
    plan = result.plan
    print(
        f"[querygen] {result.steps_run} steps in {result.seconds:.0f}s: epsilon={plan.epsilon:.3f}"
        f" delta={plan.delta:.2e} sigma={plan.noise_multiplier:.3f} q={plan.sampling_rate:.4f};"
        f" train loss (not DP, operator only) {result.losses[0]:.2f} -> "
        f"{sum(result.losses[-5:]) / 5:.2f} (mean of last 5 steps)"
    )
    shown = test.select(range(args.sample_docs))
    synthetic = querygen.generate_queries(
        out / "generator", shown, out / "synthetic", queries_per_doc=2
    )
    lines = sample_table(shown, synthetic, plan.to_dict())
    (out / "samples.md").write_text("\n".join(lines) + "\n")
    print("[querygen] " + "\n    ".join(lines))


def sample_table(shown, synthetic, plan) -> list[str]:
    """Markdown lines: each shown document's title, real query and synthetic queries."""
    lines = [
        f"Synthetic queries at epsilon={plan['epsilon']:.2f}, delta={plan['delta']:.2e} "
        f"(`make demo`, preset smollm2_lora_cpu), for held-out documents:",
        "",
        "| document | real query | synthetic queries |",
        "|---|---|---|",
    ]
    by_doc: dict[str, list[str]] = collections.defaultdict(list)
    for row in synthetic:
        by_doc[row["doc_id"]].append(row["query"])
    for row in shown:
        fake = " / ".join(q.replace("|", "/") for q in by_doc[row["doc_id"]])
        lines.append(f"| {row['title']} | {row['query']} | {fake} |")
    return lines


if __name__ == "__main__":
    main()
