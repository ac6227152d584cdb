"""Single DP answers (`retriever answer`) on the fact worlds, mechanism by mechanism.

Every question of each world is answered once at each epsilon by each mechanism, the way
`retriever answer` builds its answer (`dpsynth.evaluation.single_fact_eval`: dense
all-MiniLM-L6-v2 retrieval, SmolLM2-135M-Instruct, the mechanism's evaluated k; each answer
its own (epsilon, 1e-6) event). Worlds: `dpsynth.evaluation.fact_world` (people validation,
products and species test) and `dpsynth.evaluation.natural_world` (helpdesk validation,
facilities and lab test). The LM mechanisms (everything but facts) take 10-80 s an answer
on 2 cores, so they answer the questions at ``--lm-supports`` only.

    python scripts/single_answer_eval.py --seed 7 --domains products,species,facilities,lab \
        --mechanisms facts,keywords,icl --out runs/single_eval

Prints one row per (domain, mechanism, epsilon), writes ``<out>/single_eval.json``, and ends
with ``facts_eps5_support20=… facts_eps10_support20=… facts_abstain_unanswerable=…
facts_wrong_when_answered=… facts_seconds=… <mechanism>_eps<e>_support20=…`` over the
domains asked (support 20: the issue's target).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from dpsynth.evaluation import fact_world, natural_world
from dpsynth.evaluation.single_fact_eval import single_answers
from retriever.rag.answer_types import ABSTENTION_TEXT


def _world(domain: str, seed: int):
    if domain in natural_world.DOMAINS:
        return natural_world.make_natural_world(domain, seed=seed), (
            natural_world.natural_answer_is_right
        )
    return fact_world.make_world(domain, seed=seed), fact_world.answer_is_right


def _cell(world, is_right, questions, epsilon, mechanism, seed) -> dict:
    start = time.monotonic()
    texts = single_answers(
        world.documents, [q.question for q in questions], epsilon, mechanism=mechanism, seed=seed
    )
    seconds = (time.monotonic() - start) / max(len(questions), 1)
    by_support = defaultdict(list)
    abstained_unanswerable, wrong = [], []
    for q, text in zip(questions, texts, strict=True):
        abstained = text == ABSTENTION_TEXT
        right = q.support > 1 and not abstained and is_right(text, q.answer)
        if q.support <= 1:
            abstained_unanswerable.append(abstained)
        else:
            by_support[q.support].append(right)
        if not abstained:
            wrong.append(not right)
    return {
        "accuracy": {s: sum(v) / len(v) for s, v in sorted(by_support.items())},
        "questions": {s: len(v) for s, v in sorted(by_support.items())},
        "abstain_unanswerable": sum(abstained_unanswerable) / max(len(abstained_unanswerable), 1),
        "unanswerable": len(abstained_unanswerable),
        "wrong_when_answered": sum(wrong) / max(len(wrong), 1),
        "answered": len(wrong),
        "seconds_per_answer": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", default="products,species,facilities,lab")
    parser.add_argument("--seed", type=int, default=7, help="the worlds' seed (and the noise's)")
    parser.add_argument("--mechanisms", default="facts,keywords,icl")
    parser.add_argument("--epsilons", default="5,10")
    parser.add_argument("--lm-supports", default="20", help="supports the LM mechanisms answer")
    parser.add_argument("--out", type=Path, default=Path("runs/single_eval"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lm_supports = {int(s) for s in args.lm_supports.split(",")}
    rows = []
    for domain in args.domains.split(","):
        world, is_right = _world(domain, args.seed)
        for mechanism in args.mechanisms.split(","):
            asked = [
                q
                for q in world.questions
                if mechanism == "facts" or q.support in lm_supports or q.support <= 1
            ]
            if mechanism != "facts":  # the LM mechanisms: the unanswerable ones too, fewer
                asked = [q for q in asked if q.support in lm_supports]
            for epsilon in map(float, args.epsilons.split(",")):
                cell = _cell(world, is_right, asked, epsilon, mechanism, args.seed)
                row = {"domain": domain, "mechanism": mechanism, "epsilon": epsilon, **cell}
                rows.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "single_eval.json").write_text(json.dumps({"seed": args.seed, "rows": rows}))
    summary = {}
    for row in rows:
        m, e = row["mechanism"], f"{row['epsilon']:g}"
        summary.setdefault(f"{m}_eps{e}_support20", []).append(
            (row["accuracy"].get(20, 0.0), row["questions"].get(20, 0))
        )
        if m == "facts":
            summary.setdefault("facts_abstain_unanswerable", []).append(
                (row["abstain_unanswerable"], row["unanswerable"])
            )
            summary.setdefault("facts_wrong_when_answered", []).append(
                (row["wrong_when_answered"], row["answered"])
            )
            summary.setdefault("facts_seconds", []).append((row["seconds_per_answer"], 1))

    def mean(pairs):  # weighted by questions
        total = sum(n for _, n in pairs)
        return sum(x * n for x, n in pairs) / total if total else 0.0

    print(" ".join(f"{k}={mean(v):.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
