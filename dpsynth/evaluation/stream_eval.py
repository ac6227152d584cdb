"""Many questions against one private collection: individual versus collection accounting.

A stream of questions drawn with repetition (`zipf_stream`) is answered one after the other
by a `DPRag` charged to a real ledger (`run_stream`). Under collection accounting every
answer composes on the collection's cap and, once it is spent, every later question is
refused; under individual accounting a record pays only for the answers it takes part in
and drops out of retrieval at its cap (docs/guides/dp_rag.md). With released answers kept
(`retriever.rag.reuse`), a question asked again gets its first answer, paid once. Each
answer is appended to ``<name>.jsonl`` as soon as it exists, so an interrupted stream
resumes where it stopped. Refusals and abstentions count as wrong in every accuracy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from dpsynth.evaluation.medical_world import MedicalWorld, Question, answer_is_correct, sized_world
from retriever.rag.answer import DPRag
from synthgen.plots import pyplot
from synthgen.privacy import BudgetExceededError

TENANT = "stream"


def zipf_world(
    diseases: int, records: int, questions: int, *, exponent: float, seed: int
) -> tuple[MedicalWorld, list[Question]]:
    """The stream scripts' world (`medical_world.sized_world`) and its `zipf_stream` of
    `questions` questions."""
    world = sized_world(diseases, records, seed)
    return world, zipf_stream(world, questions, exponent=exponent, seed=seed)


def zipf_stream(
    world: MedicalWorld, questions: int, *, exponent: float = 1.0, seed: int = 0
) -> list[Question]:
    """`questions` questions drawn with repetition: disease of rank r (by support, most
    records first) with probability proportional to r**-exponent, then one of its
    paraphrases (`MedicalWorld.questions(per_disease=6)`) uniformly. The first m questions
    of a stream are the stream of m questions (a run can be extended)."""
    if questions < 1 or exponent < 0:
        raise ValueError(f"need questions >= 1 and exponent >= 0: {questions=}, {exponent=}")
    support = world.support
    phrasings: dict[str, list[Question]] = {}
    for q in world.questions(per_disease=6, seed=seed):
        phrasings.setdefault(q.disease, []).append(q)
    ranked = sorted(phrasings, key=lambda d: (-support[d], d))
    weights = np.arange(1, len(ranked) + 1, dtype=np.float64) ** -exponent
    # one uniform per question for the disease and one for the phrasing, from two streams:
    # the first m questions of a longer stream are the stream of m questions
    disease_rng, phrasing_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
    )
    cdf = np.cumsum(weights / weights.sum())
    diseases = np.minimum(
        np.searchsorted(cdf, disease_rng.random(questions), side="right"), len(ranked) - 1
    )
    picks = phrasing_rng.random(questions)
    out = []
    for d, u in zip(diseases, picks, strict=True):
        options = phrasings[ranked[d]]
        out.append(options[int(u * len(options))])
    return out


def answered(out_dir: str | Path, name: str) -> list[dict]:
    """The rows of stream `name` answered so far in `out_dir` (as `run_stream` left them)."""
    return _done(Path(out_dir) / f"{name}.jsonl")


def resume(out_dir: str | Path, name: str, total: int, progress: bool):
    """Resumes stream `name` in `out_dir`: its file, rewritten with the rows answered so far
    (a line cut by an interruption dropped), those rows, and the indices left to answer
    (under a progress bar if `progress`)."""
    path = Path(out_dir) / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = _done(path)[:total]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    todo = range(len(rows), total)
    if progress:
        from tqdm import tqdm

        todo = tqdm(todo, desc=name, initial=len(rows), total=total)
    return path, rows, todo


def answer_rows(
    path: Path,
    todo: Iterable[int],
    questions: Sequence[Question],
    answer: Callable[[Question], tuple[str, bool, dict]],
    key: str = "index",
) -> Iterator[dict]:
    """Answers ``questions[i]`` for each i of `todo` (``answer(q)``: text, correct, fields),
    each row appended to `path` as soon as it exists: `key`, disease, support, answer,
    correct, the fields, seconds."""
    with path.open("a") as sink:
        for i in todo:
            q = questions[i]
            start = time.perf_counter()
            text, correct, fields = answer(q)
            row = {key: i, "disease": q.disease, "support": q.support, "answer": text}
            row |= {"correct": correct, **fields}
            row["seconds"] = round(time.perf_counter() - start, 3)
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            yield row


def single_answer_accuracy(cells: Sequence[dict], stream: Sequence[Question]) -> dict:
    """A single-answer evaluation's accuracy (one answer per disease, no prior answers:
    `scripts/dp_rag_eval.py`'s cell rows), over its diseases uniformly, and weighted by how
    often the stream asks about each disease (diseases it did not ask count as wrong)."""
    correct = {r["disease"]: bool(r["correct"]) for r in cells}
    mix = sum(correct.get(q.disease, False) for q in stream) / len(stream)
    uniform = sum(correct.values()) / len(correct) if correct else 0.0
    return {"uniform": uniform, "stream_mix": mix, "diseases": len(correct)}


def _done(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by an interruption: answered again
            break
    return rows


def run_stream(
    name: str,
    rag: DPRag,
    stream: Sequence[Question],
    *,
    epsilon: float,
    out_dir: str | Path,
    others: Sequence[str],
    progress: bool = True,
) -> list[dict]:
    """Answers the stream in order (resuming after the answers in ``<name>.jsonl``).

    Returns:
      One row per question: index, disease, support, answer, correct, abstained, refused,
      seconds and, under individual accounting, the collection's exhausted records after
      the answer (an aggregate).
    """
    path, rows, todo = resume(out_dir, name, len(stream), progress)

    def answer(q: Question) -> tuple[str, bool, dict]:
        try:
            a = rag.answer(q.question, tenant=TENANT, epsilon=epsilon)
            text, abstained, refused, reused = a.text, a.abstained, False, a.reused
        except BudgetExceededError:
            text, abstained, refused, reused = "", False, True, False
        correct = not (refused or abstained) and answer_is_correct(text, q.answer, others=others)
        fields = {"abstained": abstained, "refused": refused, "reused": reused}
        if rag.config.individual:
            fields["exhausted"] = rag.payer.exhausted_count()
        return text, correct, fields

    return rows + list(answer_rows(path, todo, stream, answer))


def stream_summary(rows: Sequence[dict], window: int = 100) -> dict[str, float | int]:
    """answered (questions before the first refusal), accuracy over the stream and over
    its first and last `window` questions, abstentions, refusals, exhausted records,
    answers handed out again (`retriever.rag.reuse`) and the answers' total wall seconds."""
    correct = np.array([bool(r["correct"]) for r in rows])
    refused = np.array([bool(r["refused"]) for r in rows])
    first_refusal = int(np.argmax(refused)) if refused.any() else len(rows)
    return {
        "questions": len(rows),
        "answered": first_refusal,
        "accuracy": float(correct.mean()) if rows else 0.0,
        "accuracy_first": float(correct[:window].mean()) if rows else 0.0,
        "accuracy_last": float(correct[-window:].mean()) if rows else 0.0,
        "accuracy_answered": float(correct[:first_refusal].mean()) if first_refusal else 0.0,
        "abstained": int(sum(bool(r["abstained"]) for r in rows)),
        "refused": int(refused.sum()),
        "exhausted": int(rows[-1].get("exhausted", 0)) if rows else 0,
        "reused": int(sum(bool(r.get("reused", False)) for r in rows)),
        "seconds": float(sum(r.get("seconds", 0.0) for r in rows)),
    }


def plot_streams(
    streams: dict[str, Sequence[dict]],
    path: str | Path,
    title: str,
    references: dict[str, float] | None = None,
    ymax: float = 1.0,
) -> None:
    """Cumulative accuracy over the stream, one line per accounting mode, and a dashed
    line per reference accuracy (e.g. the mechanism's single-answer accuracy)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in streams.items():
        correct = np.array([bool(r["correct"]) for r in rows], dtype=np.float64)
        if correct.size:
            cumulative = np.cumsum(correct) / np.arange(1, correct.size + 1)
            ax.plot(np.arange(1, correct.size + 1), cumulative, label=label)
    for (label, value), style in zip((references or {}).items(), ("--", ":", "-."), strict=False):
        ax.axhline(value, color="grey", linestyle=style, linewidth=1, label=label)
    ax.set_xlabel("question in the stream")
    ax.set_ylabel("cumulative accuracy (refusals, abstentions wrong)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, ymax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
