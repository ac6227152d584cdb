"""Answer accuracy of the DP-RAG mechanisms on fictional medical records, cell by cell.

A cell is one (method, epsilon): a DP mechanism (default "icl" and "keywords", each with
its own number of documents k) at a per-answer epsilon, or a non-private reference: "rag"
(the top-k records by exact similarity in one prompt, greedy decoding) or "no-rag" (the
question alone). Each cell reports its accuracy by support bin and its readability
(`accuracy_table`). Every cell answers the same questions of a
`dpsynth.evaluation.medical_world` world, embedded once (cached in the output folder); each
answer is appended to ``cells/<cell>.jsonl`` as soon as it exists, so an interrupted run
resumes. No ledger is involved: this is an experiment on a synthetic collection.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy import sparse

from dpsynth.evaluation.medical_world import MedicalWorld, Question, answer_is_correct
from dpsynth.evaluation.stream_eval import answer_rows, resume
from retriever.rag.answer import DPRag, RagConfig
from retriever.rag.greedy import greedy_answer
from retriever.rag.prompts import PromptFormat
from retriever.rag.text import unreadable_count
from synthgen.plots import pyplot

SUPPORT_BINS = ((1, 2), (3, 9), (10, 29), (30, 99), (100, 10**9))
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
    mechanisms: tuple[str, ...] = ("icl", "keywords")
    rag_k: int = 8
    seed: int = 0
    mechanism_k: tuple[tuple[str, int], ...] = ()  # (mechanism, k); others: the rag's k

    def k_of(self, mechanism: str, default: int) -> int:
        return dict(self.mechanism_k).get(mechanism, default)


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
    path, rows, todo = resume(out_dir / "cells", name, len(questions), progress)

    def answer(q: Question) -> tuple[str, bool, dict]:
        text, extra = answer_fn(q)
        fields = {"unreadable": unreadable_count(text) > 0, "abstained": False}
        return text, answer_is_correct(text, q.answer, others=others), fields | extra

    return rows + list(answer_rows(path, todo, questions, answer, key="question_index"))


def public_logprob(lm, prompt_ids: list[int], text: str) -> float | None:
    """Mean log-probability per token of `text` after `prompt_ids` under `lm` (None: empty)."""
    ids = lm.encode(text)
    if not ids:
        return None
    rows = lm.score([prompt_ids + ids[:j] for j in range(len(ids))])
    return float(np.mean([rows[j][t] for j, t in enumerate(ids)]))


def add_readability(rows: list[dict], questions: Sequence[Question], lm, prompt) -> None:
    """Fills each row's ``public_logprob`` (None for abstentions and empty answers)."""
    for row in rows:
        if "public_logprob" in row:
            continue
        q = questions[row["question_index"]]
        text = "" if row["abstained"] else row["answer"]
        row["public_logprob"] = public_logprob(lm, prompt.encode(lm, q.question, []), text)


def evaluate_world(
    world: MedicalWorld,
    questions: Sequence[Question],
    rag: DPRag,
    config: EvalConfig,
    out_dir: str | Path,
    *,
    readability: bool = False,
) -> dict[str, list[dict]]:
    """Runs (or resumes) every cell; returns {cell: rows}.

    Each mechanism answers with ``config.k_of(mechanism, rag.config.k)`` documents; with
    `readability`, rows also get their answers' `public_logprob` (kept in the cell file).
    """
    out_dir = Path(out_dir)
    others = [d.name for d in world.diseases]
    lm, prompt = rag.lm, rag.prompt
    max_tokens = rag.config.max_tokens
    if sparse.issparse(rag.embeddings):  # term overlap: a question's vector is WIDTH wide
        question_vectors = None  # made when its question is asked
    else:
        question_vectors = np.asarray(rag.encode_question([q.question for q in questions]))

    def no_rag(q: Question) -> tuple[str, dict]:
        return greedy_answer(lm, prompt.encode(lm, q.question, []), max_tokens), {}

    def non_private_rag(q: Question) -> tuple[str, dict]:
        if question_vectors is None:
            scores = rag._scores(q.question)
        else:
            scores = rag.embeddings @ question_vectors[questions.index(q)]
        top = np.argsort(-scores)[: config.rag_k]
        docs = [rag._tokens[int(i)][: rag.config.max_document_tokens] for i in top]
        return greedy_answer(lm, prompt.encode(lm, q.question, docs), max_tokens), {}

    results = {
        "no-rag": run_cell("no-rag", questions, no_rag, out_dir, others=others),
        "rag": run_cell("rag", questions, non_private_rag, out_dir, others=others),
    }
    for mechanism in config.mechanisms:
        k = config.k_of(mechanism, rag.config.k)
        mech_rag = rag.with_config(dataclasses.replace(rag.config, k=k))
        for epsilon in config.epsilons:

            def dp(q: Question, rag=mech_rag, mechanism=mechanism, epsilon=epsilon, k=k):
                a = rag.answer(q.question, tenant="eval", epsilon=epsilon, mechanism=mechanism)
                extra = {"epsilon": a.epsilon, "paid_tokens": a.paid_tokens, "k": k}
                return a.text, extra | {"abstained": a.abstained}

            name = f"{mechanism}-eps{epsilon:g}"
            results[name] = run_cell(name, questions, dp, out_dir, others=others)
    if readability:
        for name, rows in results.items():
            if any("public_logprob" not in r for r in rows):
                add_readability(rows, questions, lm, prompt)
                path = out_dir / "cells" / f"{name}.jsonl"
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return results


def accuracy_table(results: dict[str, list[dict]]) -> list[dict]:
    """One row per cell: accuracy overall and per support bin (None: no question), the
    shares of unreadable answers (U+FFFD or control characters) and of abstentions, and
    the mean `public_logprob` of its answers (the public LM given the question alone;
    None: not measured or all abstained)."""
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
        entry["unreadable"] = float(np.mean([r.get("unreadable", False) for r in rows]))
        entry["abstained"] = float(np.mean([r.get("abstained", False) for r in rows]))
        logprobs = [r["public_logprob"] for r in rows if r.get("public_logprob") is not None]
        entry["public_logprob"] = float(np.mean(logprobs)) if logprobs else None
        entry["k"] = rows[0].get("k") if rows else None
        entry["seconds_per_answer"] = float(np.mean([r["seconds"] for r in rows]))
        table.append(entry)
    return table


def markdown_table(table: list[dict]) -> str:
    bins = [bin_label(*b) for b in SUPPORT_BINS]

    def fmt(value, spec=".2f") -> str:
        return "–" if value is None else format(value, spec)

    head = (
        "| cell | k | accuracy | "
        + " | ".join(f"support {b}" for b in bins)
        + " | abstained | unreadable | public log-prob/token | s/answer |"
    )
    lines = [head, "|" + "---|" * (len(bins) + 7)]
    for e in table:
        lines.append(
            f"| {e['cell']} | {fmt(e.get('k'), 'd')} | {e['accuracy']:.2f} | "
            + " | ".join(fmt(e[b]) for b in bins)
            + f" | {fmt(e.get('abstained'))} | {fmt(e.get('unreadable'))} | "
            + f"{fmt(e.get('public_logprob'))} | {e['seconds_per_answer']:.1f} |"
        )
    return "\n".join(lines)


def plot(table: list[dict], config: EvalConfig, path: str | Path) -> None:
    """Accuracy and abstention against per-answer epsilon, and accuracy by support."""
    plt = pyplot()

    by_cell = {e["cell"]: e for e in table}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    refs = (("rag", "--"), ("no-rag", ":"))
    for ax, key, title in (
        (axes[0], "accuracy", "Accuracy vs ε"),
        (axes[1], "abstained", "Abstentions vs ε"),
    ):
        for mechanism in config.mechanisms:
            cells = [by_cell[f"{mechanism}-eps{e:g}"] for e in config.epsilons]
            ax.plot(
                config.epsilons,
                [c[key] for c in cells],
                marker="o",
                label=f"{mechanism} (k={cells[0].get('k')})",
            )
        if key == "accuracy":
            for ref, style in refs:
                ax.axhline(
                    by_cell[ref][key], linestyle=style, color="gray", label=f"{ref} (non-DP)"
                )
        ax.set_xlabel("per-answer ε (δ = 1e-6)")
        ax.set_ylabel(f"share of answers: {key}")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax = axes[2]
    bins = [bin_label(*b) for b in SUPPORT_BINS]
    best = max(config.epsilons)
    for cell in ["rag", "no-rag"] + [f"{m}-eps{best:g}" for m in config.mechanisms]:
        ys = [by_cell[cell][b] if by_cell[cell][b] is not None else np.nan for b in bins]
        ax.plot(bins, ys, marker="o", label=cell)
    ax.set_xlabel("records stating the answer (support)")
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
    """The answer stage over the world's records (embeddings cached in `out_dir`).

    ``encoder="overlap"`` scores by term overlap (`retriever.lexical.OverlapEncoder`, each
    content word weighted by its token count under `lm`: a public rarity proxy)."""
    from retriever.encoders import load_encoder

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = [r.text for r in world.records]
    if encoder == "overlap":
        from retriever.rag.loading import overlap_encoder

        overlap = overlap_encoder(texts, lm)
        embeddings, encode = overlap.documents(), overlap.encode
    else:
        question_encoder = load_encoder(encoder)
        encode = question_encoder.encode
        cache = out_dir / "record_embeddings.npy"
        if cache.is_file():
            embeddings = np.load(cache)
        else:
            embeddings = question_encoder.encode(texts, progress=True)
            np.save(cache, embeddings)
    return DPRag(
        [r.doc_id for r in world.records],
        texts,
        embeddings,
        encode,
        lm,
        config=config,
        prompt=MEDICAL_PROMPT,
        rng=np.random.default_rng(seed),
    )
