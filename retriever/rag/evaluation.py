"""Answer accuracy of the DP-RAG mechanisms on fictional medical records, cell by cell.

A cell is one (method, epsilon): the DP mechanisms ("icl", "vote", "sparse-vote") at each
per-answer epsilon, plus two non-private references: "rag" (the top-k records by exact
similarity in one prompt, greedy decoding) and "no-rag" (the question alone). Every cell
answers the same questions; each answer is appended to ``cells/<cell>.jsonl`` as soon as it
exists, so an interrupted run resumes where it stopped (per question). The collection is a
world of `retriever.rag.medical`, embedded once with the question encoder (cached in the
output folder). No ledger is involved: this is an experiment on a synthetic collection.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.medical import MedicalWorld, Question, answer_is_correct
from retriever.rag.prompts import PromptFormat

SUPPORT_BINS = ((1, 2), (3, 5), (6, 15), (16, 10**9))
MEDICAL_PROMPT = PromptFormat(
    instruction=(
        "You are a medical assistant. Use the patient records to name the disease. "
        "Reply with the disease name only."
    ),
    answer_prefix="Diagnosis:",
)


def bin_label(low: int, high: int) -> str:
    return f"{low}+" if high >= 10**9 else f"{low}-{high}"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What the evaluation runs (all public)."""

    epsilons: tuple[float, ...] = (1.0, 3.0, 5.0, 10.0)
    mechanisms: tuple[str, ...] = ("icl", "vote", "sparse-vote")
    rag_k: int = 8
    seed: int = 0


def greedy_answer(lm, prompt_ids: list[int], max_tokens: int) -> str:
    """Non-private greedy decoding of one prompt (the references)."""
    tokens: list[int] = []
    logprobs = lm.start([prompt_ids], max_tokens)
    for _ in range(max_tokens):
        token = int(np.argmax(logprobs[0]))
        if token in lm.eos_ids:
            break
        tokens.append(token)
        if len(tokens) < max_tokens:
            logprobs = lm.append(token)
    return lm.decode(tokens).strip()


def _done(path: Path) -> dict[int, dict]:
    if not path.is_file():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["question_index"]] = row
    return rows


def run_cell(
    name: str,
    questions: Sequence[Question],
    answer_fn: Callable[[Question], tuple[str, dict]],
    out_dir: Path,
    *,
    others: Sequence[str],
    progress: bool = True,
) -> list[dict]:
    """Answers every question not yet in ``cells/<name>.jsonl``; returns all rows."""
    path = out_dir / "cells" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = _done(path)
    todo = [i for i in range(len(questions)) if i not in rows]
    if todo and progress:
        from tqdm import tqdm

        todo = tqdm(todo, desc=name, leave=False)
    with path.open("a") as sink:
        for i in todo:
            q = questions[i]
            start = time.perf_counter()
            text, extra = answer_fn(q)
            row = {
                "question_index": i,
                "disease": q.disease,
                "support": q.support,
                "answer": text,
                "correct": answer_is_correct(text, q.answer, others=others),
                "seconds": round(time.perf_counter() - start, 3),
                **extra,
            }
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            rows[i] = row
    return [rows[i] for i in sorted(rows)]


def evaluate_world(
    world: MedicalWorld,
    questions: Sequence[Question],
    rag: DPRag,
    config: EvalConfig,
    out_dir: str | Path,
) -> dict[str, list[dict]]:
    """Runs (or resumes) every cell; returns {cell: rows}."""
    out_dir = Path(out_dir)
    others = [d.name for d in world.diseases]
    lm, prompt = rag.lm, rag.prompt
    max_tokens = rag.config.max_tokens
    question_vectors = np.asarray(rag.encode_question([q.question for q in questions]))

    def no_rag(q: Question) -> tuple[str, dict]:
        return greedy_answer(lm, prompt.encode(lm, q.question, []), max_tokens), {}

    def non_private_rag(q: Question) -> tuple[str, dict]:
        scores = rag.embeddings @ question_vectors[questions.index(q)]
        top = np.argsort(-scores)[: config.rag_k]
        docs = [rag._document_ids(int(i)) for i in top]
        return greedy_answer(lm, prompt.encode(lm, q.question, docs), max_tokens), {}

    results = {
        "no-rag": run_cell("no-rag", questions, no_rag, out_dir, others=others),
        "rag": run_cell("rag", questions, non_private_rag, out_dir, others=others),
    }
    for mechanism in config.mechanisms:
        for epsilon in config.epsilons:

            def dp(q: Question, mechanism=mechanism, epsilon=epsilon) -> tuple[str, dict]:
                a = rag.answer(q.question, tenant="eval", epsilon=epsilon, mechanism=mechanism)
                return a.text, {"epsilon": a.epsilon, "paid_tokens": a.paid_tokens}

            name = f"{mechanism}-eps{epsilon:g}"
            results[name] = run_cell(name, questions, dp, out_dir, others=others)
    return results


def accuracy_table(results: dict[str, list[dict]]) -> list[dict]:
    """One row per cell: overall accuracy and accuracy per support bin (None: no question)."""
    table = []
    for cell, rows in results.items():
        entry = {
            "cell": cell,
            "n": len(rows),
            "accuracy": float(np.mean([r["correct"] for r in rows])),
        }
        for low, high in SUPPORT_BINS:
            hits = [r["correct"] for r in rows if low <= r["support"] <= high]
            entry[bin_label(low, high)] = float(np.mean(hits)) if hits else None
        entry["seconds_per_answer"] = float(np.mean([r["seconds"] for r in rows]))
        table.append(entry)
    return table


def markdown_table(table: list[dict]) -> str:
    bins = [bin_label(*b) for b in SUPPORT_BINS]
    head = "| cell | n | accuracy | " + " | ".join(f"support {b}" for b in bins) + " | s/answer |"
    lines = [head, "|" + "---|" * (len(bins) + 4)]
    for e in table:
        cells = [f"{e[b]:.2f}" if e[b] is not None else "–" for b in bins]
        lines.append(
            f"| {e['cell']} | {e['n']} | {e['accuracy']:.2f} | "
            + " | ".join(cells)
            + f" | {e['seconds_per_answer']:.1f} |"
        )
    return "\n".join(lines)


def plot(table: list[dict], config: EvalConfig, path: str | Path) -> None:
    """Accuracy against per-answer epsilon per mechanism, with the two references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cell = {e["cell"]: e for e in table}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for mechanism in config.mechanisms:
        ys = [by_cell[f"{mechanism}-eps{e:g}"]["accuracy"] for e in config.epsilons]
        ax.plot(config.epsilons, ys, marker="o", label=mechanism)
    for ref, style in (("rag", "--"), ("no-rag", ":")):
        ax.axhline(by_cell[ref]["accuracy"], linestyle=style, color="gray", label=f"{ref} (non-DP)")
    ax.set_xlabel("per-answer ε (δ = 1e-6)")
    ax.set_ylabel("answer accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Accuracy vs ε")
    ax.legend(fontsize=8)
    ax = axes[1]
    bins = [bin_label(*b) for b in SUPPORT_BINS]
    best = max(config.epsilons)
    for cell in ["rag", "no-rag"] + [f"{m}-eps{best:g}" for m in config.mechanisms]:
        ys = [by_cell[cell][b] if by_cell[cell][b] is not None else np.nan for b in bins]
        ax.plot(bins, ys, marker="o", label=cell)
    ax.set_xlabel("records sharing the fact (support)")
    ax.set_ylabel("answer accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Accuracy by support (DP at ε = {best:g})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_rag(
    world: MedicalWorld,
    out_dir: str | Path,
    *,
    lm,
    encoder: str = "all-minilm-l6-v2",
    config: RagConfig,
    seed: int = 0,
) -> DPRag:
    """The answer stage over the world's records (embeddings cached in `out_dir`)."""
    from retriever.encoders import load_encoder

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    question_encoder = load_encoder(encoder)
    cache = out_dir / "record_embeddings.npy"
    texts = [r.text for r in world.records]
    if cache.is_file():
        embeddings = np.load(cache)
    else:
        embeddings = question_encoder.encode(texts, progress=True)
        np.save(cache, embeddings)
    return DPRag(
        [r.doc_id for r in world.records],
        texts,
        embeddings,
        question_encoder.encode,
        lm,
        config=config,
        prompt=MEDICAL_PROMPT,
        rng=np.random.default_rng(seed),
    )
