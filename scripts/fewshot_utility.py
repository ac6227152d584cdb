"""Utility of DP few-shot synthetic documents: topic classification on wiki-summaries-en.

Private data: the train split (`corpora.split_by_document`) of lead paragraphs with their
topic; the label set is the public list `WIKI_TOPICS` (never read from the rows) and the pool
size is the declared public figure `--public-pool-size`. For each epsilon,
`synthgen.fewshot.generate` writes `--per-label` synthetic paragraphs per topic from
SmolLM2-135M-Instruct (fresh Poisson draw per token, Gaussian mechanism, RVP over the public
prompt's top-K tokens). A logistic regression on all-MiniLM-L6-v2 embeddings is trained on
them and scored on the real test split. Cells:

* zero-shot (no examples): nearest label description ("An encyclopedia article about X.");
* real-k: the same classifier on k real train paragraphs per topic (k = --per-label);
* real-all: on all real train paragraphs (an upper bound);
* synthetic-<eps>: on the DP few-shot synthetic paragraphs;
* pe-<eps>: on Private Evolution paragraphs (`synthgen.evolution`): a public first
  population from "Write one paragraph of an encyclopedia article about <topic>." (generated
  once, `<out>/pe_initial.json`, shared by the PE cells: it reads no private data), then
  `--pe-iterations` DP nearest-neighbour histograms of the private train paragraphs'
  MiniLM embeddings, with LM paraphrases of the selected synthetic paragraphs in between;
  `--pe-samples` paragraphs are released (drawn from the last histogram);
* pe-initial: on that public first population alone (no private data: what PE's DP
  selection adds is pe-<eps> minus this).

Privacy: every synthetic cell is released (results.json holds its samples), so all cells
charge the same private data to ONE ledger scope: `--ledger` (default: the default ledger,
`synthgen.paths.default_ledger_path`), `--tenant demo --dataset wiki-train`, the scope the
few-shot guide's `synthgen generate-docs` run on the same train split charges too; the ledger
composes them all (docs/guides/fewshot.md states the total). `--budget` is the cap of that scope if
this run opens it. Released files hold no timings of private work.

Finished cells are cached in `<out>/cells/*.json` (rerun resumes); writes
`<out>/results.json` and `<out>/fewshot_utility.png` and prints a markdown table.

    python scripts/fewshot_utility.py --out runs/fewshot_utility   # 15-25 min per epsilon
    python scripts/fewshot_utility.py --out runs/fewshot_utility --methods pe   # PE only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from synthgen import fewshot
from synthgen.paths import default_ledger_path
from synthgen.plots import pyplot
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.privacy.receipts import ledger_payer

# The corpus's public topic list (Wikipedia's vital-article topics, plus the loader's
# "Uncategorized"): the label set of the private train split, declared, never read from it.
WIKI_TOPICS = (
    "Arts",
    "Biology and health sciences",
    "Everyday life",
    "Geography",
    "History",
    "Mathematics",
    "People",
    "Philosophy and religion",
    "Physical sciences",
    "Society and social sciences",
    "Technology",
    "Uncategorized",
)
# Shared with the few-shot guide's `synthgen generate-docs` run on the same private train split.
TENANT, DATASET, PUBLIC_POOL_SIZE, BUDGET = "demo", "wiki-train", 150, 24.0
PE_PUBLIC_SIZE = 8000  # the 7,890 wiki train paragraphs, rounded up


def logistic_regression(x, y, classes, *, l2=1e-3, steps=500, lr=2.0):
    """Multinomial logistic regression by full-batch gradient descent: weights [d+1, C]."""
    x1 = np.hstack([x, np.ones((len(x), 1), x.dtype)])
    onehot = np.eye(classes)[y]
    w = np.zeros((x1.shape[1], classes))
    for _ in range(steps):
        logits = x1 @ w
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        w -= lr * (x1.T @ (p - onehot) / len(x1) + l2 * w)
    return w


def accuracy(w, x, y) -> float:
    x1 = np.hstack([x, np.ones((len(x), 1), x.dtype)])
    return float(np.mean(np.argmax(x1 @ w, 1) == y))


def _cell(out: Path, name: str, run) -> dict:
    """Runs (or reloads) one cell; what it writes is released, so it holds no timings."""
    path = out / "cells" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    result = run()
    result.update(cell=name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"[{name}] " + json.dumps({k: v for k, v in result.items() if k != "samples"}),
          flush=True)  # fmt: skip
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options; the ledger scope defaults to the few-shot guide's run's."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/fewshot_utility"))
    parser.add_argument("--ledger", type=Path, default=None, help="default: the default ledger")
    parser.add_argument("--tenant", default=TENANT)
    parser.add_argument("--dataset", default=DATASET, help="ledger scope of the train split")
    parser.add_argument("--budget", type=float, default=BUDGET, help="cap if the scope is new")
    parser.add_argument("--public-pool-size", type=int, default=PUBLIC_POOL_SIZE)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    parser.add_argument("--per-label", type=int, default=1)
    parser.add_argument("--subsets", type=int, default=4)
    parser.add_argument("--shots", type=int, default=1)
    parser.add_argument("--shot-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--public-vocab", type=int, default=50)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["fewshot", "pe"],
        choices=["fewshot", "pe"],
        help="which DP generators get cells",
    )
    parser.add_argument(
        "--pe-public-size",
        type=int,
        default=PE_PUBLIC_SIZE,
        help="PE: declared N of the private paragraphs (at least their count)",
    )
    parser.add_argument("--pe-population", type=int, default=12, help="PE: per topic")
    parser.add_argument("--pe-samples", type=int, default=144, help="PE: released, in all")
    parser.add_argument("--pe-iterations", type=int, default=3)
    parser.add_argument("--pe-max-new-tokens", type=int, default=64)
    parser.add_argument("--pe-batch-size", type=int, default=32)
    parser.add_argument(
        "--pe-repeats", type=int, default=1,
        help="PE runs per epsilon (each one a further release, charged too)",
    )  # fmt: skip
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    args.ledger = args.ledger or default_ledger_path()
    return args


def open_scope(args: argparse.Namespace, plan: fewshot.FewShotPlan) -> PrivacyLedger:
    """The one ledger scope of the private train split (opened with `--budget` if new)."""
    ledger = PrivacyLedger(args.ledger)
    ledger.ensure_scope(Scope(args.tenant, args.dataset, args.budget, plan.delta))
    return ledger


def main() -> None:
    from retriever.encoders import load_encoder
    from synthgen import corpora
    from synthgen.lm_backends import FlaxLM
    from synthgen.privacy import secure_rng

    args = parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(all_cells(out), out)
        return

    train, test = corpora.split_by_document(corpora.load_wiki_summaries("wiki-summaries-en"))
    labels = sorted(WIKI_TOPICS)
    index = {t: i for i, t in enumerate(labels)}
    encoder = load_encoder("all-minilm-l6-v2")
    x_test = encoder.encode(test["document"], progress=True)
    y_test = np.array([index[t] for t in test["topic"]])
    base = {"num_test": len(test), "labels": len(labels)}

    def zero_shot():
        names = encoder.encode([f"An encyclopedia article about {t}." for t in labels])
        pred = np.argmax(x_test @ names.T, 1)
        return {**base, "epsilon": None, "accuracy": float(np.mean(pred == y_test))}

    def real(k: int | None):
        def run():
            rng = np.random.default_rng(0)
            topics = np.array(train["topic"])
            picks = np.concatenate([
                rng.permutation(np.flatnonzero(topics == t))[:k] for t in labels
            ]) if k else np.arange(len(train))  # fmt: skip
            x = encoder.encode([train["document"][i] for i in picks], progress=True)
            y = np.array([index[topics[i]] for i in picks])
            w = logistic_regression(x, y, len(labels))
            return {**base, "epsilon": None, "train_examples": len(picks),
                    "accuracy": accuracy(w, x_test, y_test)}  # fmt: skip

        return run

    results = [
        _cell(out, "zero-shot", zero_shot),
        _cell(out, f"real-{args.per_label}", real(args.per_label)),
        _cell(out, "real-all", real(None)),
    ]
    lm = None
    private = [
        {"text": d, "label": t} for d, t in zip(train["document"], train["topic"], strict=True)
    ]
    targets = fewshot.round_robin_targets(labels, args.per_label * len(labels))
    for eps in args.epsilons if "fewshot" in args.methods else []:

        def synthetic(eps=eps):
            nonlocal lm
            config = fewshot.FewShotConfig(
                public_pool_size=args.public_pool_size, subsets=args.subsets, shots=args.shots,
                shot_tokens=args.shot_tokens, max_new_tokens=args.max_new_tokens,
                target_epsilon=eps, public_vocab=args.public_vocab, resample="token",
            )  # fmt: skip
            plan = fewshot.plan_for(private, targets, fewshot.DOCUMENT_TEMPLATE, config,
                                    pool_field="label")  # fmt: skip
            pay = ledger_payer(open_scope(args, plan), (args.tenant, args.dataset),
                               stage="fewshot-generate")  # fmt: skip
            pay.check(plan)  # before loading the LM
            lm = lm or FlaxLM.load(args.model)
            result = fewshot.generate(
                lm, private, targets, fewshot.DOCUMENT_TEMPLATE, config, pool_field="label",
                rng=secure_rng(), plan=plan, pay=pay,
            )  # fmt: skip
            texts = [t if t else "(empty)" for t in result.texts]
            x = encoder.encode(texts)
            y = np.array([index[t["label"]] for t in targets])
            w = logistic_regression(x, y, len(labels))
            return {
                **base, "epsilon": plan.epsilon, "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier, "sampling_rate": plan.sampling_rate,
                "public_pool_size": plan.public_pool_size, "tokens_charged": plan.tokens,
                "tokens_released": result.tokens_released,
                "train_examples": len(texts), "accuracy": accuracy(w, x_test, y_test),
                "samples": [{"label": t["label"], "text": s}
                            for t, s in zip(targets, result.texts, strict=True)],
            }  # fmt: skip

        results.append(_cell(out, f"synthetic-{eps:g}", synthetic))
    if "pe" in args.methods:
        results += pe_cells(args, encoder, private, labels, (x_test, y_test), base)
    report(all_cells(out), out)


def all_cells(out: Path) -> list[dict]:
    """Every finished cell in `<out>/cells`: baselines, then few-shot, then PE cells."""
    cells = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    kind = {"synthetic": 1, "pe": 2}
    return sorted(cells, key=lambda c: (kind.get(c["cell"].split("-")[0], 0),
                                        c["epsilon"] or 0, c["cell"]))  # fmt: skip


def pe_config(args: argparse.Namespace, labels: list[str], eps: float):
    """The PE cell's public parameters: N = --pe-public-size declared (at least the private
    count), delta the few-shot cells' 1/(10 N') of their declared pool sizes N' (the scope's
    one delta)."""
    from synthgen import evolution

    return evolution.EvolutionConfig(
        num_samples=args.pe_samples, iterations=args.pe_iterations, target_epsilon=eps,
        public_size=args.pe_public_size, labels=tuple(labels),
        delta=1 / (10 * args.public_pool_size * len(labels)),
        population=args.pe_population, max_new_tokens=args.pe_max_new_tokens,
        batch_size=args.pe_batch_size,
    )  # fmt: skip


def plan_pe(args: argparse.Namespace, labels: list[str], eps: float):
    """The PE cell's plan (public figures only)."""
    from synthgen import evolution

    return evolution.plan_evolution(pe_config(args, labels, eps))


def pe_cells(args, encoder, private, labels, test, base) -> list[dict]:
    """The Private Evolution cells: one shared public first population, one run per epsilon."""
    import time

    from tqdm import tqdm

    from synthgen import evolution
    from synthgen.lm_backends import FlaxLM
    from synthgen.privacy import secure_rng

    def embed(texts):
        return encoder.encode([t if t else "(empty)" for t in texts])

    def config(eps: float) -> evolution.EvolutionConfig:
        return pe_config(args, labels, eps)

    lm, sampler, timing = None, None, {}

    def get_sampler():
        nonlocal lm, sampler
        if sampler is None:
            lm = FlaxLM.load(args.model)
            cfg = config(1.0)
            sampler = evolution.make_sampler(
                lm, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                top_p=cfg.top_p, batch_size=cfg.batch_size,
            )  # fmt: skip
        return sampler

    initial_path = args.out / "pe_initial.json"
    if initial_path.is_file():
        initial = json.loads(initial_path.read_text())
    else:  # public work only: prompts name the public topics
        prompts = [p for _, p in evolution.initial_prompts(config(1.0))]
        began = time.perf_counter()
        initial = []
        for start in tqdm(range(0, len(prompts), args.pe_batch_size), desc="PE initial"):
            initial += get_sampler().sample(prompts[start : start + args.pe_batch_size], start)
        seconds = time.perf_counter() - began
        print(f"PE initial population: {len(initial)} samples in {seconds:.0f} s "
              f"({len(initial) / seconds:.2f} samples/s)", flush=True)  # fmt: skip
        initial_path.write_text(json.dumps(initial, indent=1))
    index = {t: i for i, t in enumerate(labels)}

    def public_only():  # the first population alone: no private data, no privacy cost
        first = evolution.initial_prompts(config(1.0))
        w = logistic_regression(embed(initial), np.array([index[lb] for lb, _ in first]),
                                len(labels))  # fmt: skip
        return {**base, "epsilon": None, "train_examples": len(initial),
                "accuracy": accuracy(w, *test)}  # fmt: skip

    cells = [_cell(args.out, "pe-initial", public_only)]
    texts = [r["text"] for r in private]
    private_labels = [r["label"] for r in private]
    private_emb = None  # embedded once, on the first cell that runs
    runs = [(eps, r) for r in range(1, args.pe_repeats + 1) for eps in args.epsilons]
    for eps, repeat in runs:
        name = f"pe-{eps:g}" + (f"-r{repeat}" if repeat > 1 else "")

        def run(eps=eps):
            nonlocal private_emb
            cfg = config(eps)
            plan = evolution.plan_evolution(cfg)
            ledger = PrivacyLedger(args.ledger)
            ledger.ensure_scope(Scope(args.tenant, args.dataset, args.budget, plan.delta))
            pay = ledger_payer(ledger, (args.tenant, args.dataset), stage="evolution")
            pay.check(plan)  # before encoding the private texts
            if private_emb is None:
                private_emb = encoder.encode(texts)  # no progress bar: private work's timing
            bar = tqdm(desc=f"PE eps={eps:g}", bar_format="{desc}: {postfix}")

            def progress(stage, done, total):
                bar.set_postfix_str(f"{stage} {done}/{total}")
                bar.update(0 if stage == "histogram" and done == 0 else 1)

            result = evolution.evolve(
                get_sampler(), embed, texts, cfg, rng=secure_rng(), private_labels=private_labels,
                initial=initial, private_embeddings=private_emb, plan=plan, progress=progress,
                pay=pay,
            )  # fmt: skip
            bar.close()
            timing[eps] = result.samples_generated / max(result.generation_seconds, 1e-9)
            x = embed(result.texts)
            y = np.array([index[label] for label in result.labels])
            w = logistic_regression(x, y, len(labels))
            return {
                **base, "epsilon": plan.epsilon, "delta": plan.delta,
                "noise_multiplier": plan.noise_multiplier, "noise_std": plan.noise_std,
                "threshold_count": plan.threshold_count, "iterations": plan.iterations,
                "population_per_topic": args.pe_population,
                "selected_share": result.selected_share,
                "train_examples": len(result.texts), "accuracy": accuracy(w, *test),
                "samples": [{"label": label, "text": text}
                            for label, text in zip(result.labels, result.texts, strict=True)],
            }  # fmt: skip

        cells.append(_cell(args.out, name, run))
        if eps in timing:  # printed, never written to the released cells
            print(f"[{name}] LM variations: {timing.pop(eps):.2f} samples/s", flush=True)
    return cells


def report(cells: list[dict], out: Path) -> None:
    """Writes results.json and the plot; prints a markdown table."""
    (out / "results.json").write_text(json.dumps(cells, indent=1))
    print("| cell | epsilon | training examples | test accuracy |\n|---|---|---|---|")
    for c in cells:
        eps = "-" if c["epsilon"] is None else f"{c['epsilon']:.3g}"
        print(f"| {c['cell']} | {eps} | {c.get('train_examples', 0)} | {c['accuracy']:.3f} |")
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for prefix, name in (("synthetic", "DP few-shot synthetic"), ("pe-", "Private Evolution")):
        runs: dict[float, list[float]] = {}
        for c in cells:
            if c["cell"].startswith(prefix) and c["epsilon"] is not None:
                runs.setdefault(round(c["epsilon"], 1), []).append(c["accuracy"])
        if runs:  # the mean over repeats, every run as a dot
            xs = sorted(runs)
            line = ax.plot(xs, [np.mean(runs[x]) for x in xs], marker="o", label=name)[0]
            for x in xs:
                ax.scatter([x] * len(runs[x]), runs[x], s=12, color=line.get_color(), alpha=0.5)
    baselines = [c for c in cells if c["epsilon"] is None]
    for c, style in zip(baselines, ("-.", "--", ":", (0, (1, 4))), strict=False):
        public = c["cell"] == "pe-initial"  # PE's first population: no private data
        ax.axhline(c["accuracy"], linestyle=style, color="tab:orange" if public else "gray",
                   label="PE first population (public only)" if public else c["cell"])  # fmt: skip
    ax.set_xlabel("epsilon of each cell (delta = 1/(10 N), N declared)")
    ax.set_ylabel("topic accuracy on real test paragraphs")
    ax.set_title("wiki-summaries-en: classifier on DP synthetic data")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fewshot_utility.png", dpi=120)


if __name__ == "__main__":
    main()
