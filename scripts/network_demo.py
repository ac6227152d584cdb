"""Retrieval network demo: 3 contributors' one-time DP releases vs query-time DP-RAG.

Splits the fictional medical collection of the DP-RAG evaluation (`scripts/dp_rag_eval.py`:
400 records, 20 invented diseases) into 3 contributors (records round-robin). For each
release epsilon it builds every contributor's DP synthetic knowledge
(`retriever contributor build`'s library call, charged to that contributor's own ledger),
starts the 3 contributors as real `retriever contributor serve` processes on loopback,
and answers the evaluation questions through a `NetworkQueryEngine` (free `/retrieve` at
each contributor, merge by score, SmolLM2 answering over the merged documents). Then it
compares, at equal total epsilon after Q questions, with query-time DP-RAG (icl, the
per-answer epsilon = total / Q by basic composition), non-private RAG and no-RAG, and
measures the network's Recall@10 against one exact index holding every synthetic document.

    python scripts/network_demo.py --out runs/network_demo          # ~25 min on 2 CPU cores

Resumable: builds, network answers and DP-RAG cells are kept in --out. Writes results.json,
table.md and network.png; last line ``network_best=<acc> dprag_q1000_best=<acc> ...``.

With ``--facts`` it measures the default release instead, the fact release
(`synthgen.knowledge.facts`), on the fact worlds (`retriever.rag.fact_world`; people chose
every default, products and species are reported): each world's documents are split
round-robin over 3 contributors, each releases its facts at ``--fact-epsilon`` (delta 1e-6)
charged to its own ledger, serves them as a real `retriever contributor serve` process, and
20 questions about facts stated in >= 10 documents (so 3 or more per contributor; a world
of 7 facts per support level holds 21, the first 20 are asked) go through the engine, which
answers from the merged fact records with SmolLM2 (`retriever.network.facts`). Also
reported: the same answerer over the union of the 3 whole releases (what a perfect fetch
would give). Last line ``network_right=<n>/20`` (the lower test domain) and each domain's.

    python scripts/network_demo.py --facts --out runs/network_facts   # ~5 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from synthgen.plots import pyplot

QS = (1, 10, 100, 1000)


def split_world(world, root: Path, parts: int) -> list[Path]:
    """Writes corpus.jsonl of each contributor (records round-robin)."""
    paths = []
    for c in range(parts):
        path = root / f"contributor-{c}" / "private.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for r in world.records[c::parts]:
                f.write(json.dumps({"doc_id": r.doc_id, "text": r.text}) + "\n")
        paths.append(path)
    return paths


def build_all(args, corpora: list[Path], epsilon: float, lm) -> list[tuple[Path, Path]]:
    """Each contributor's release at `epsilon` (kept when already built)."""
    from retriever.network.knowledge import build_knowledge
    from synthgen.knowledge import (
        MEDICAL_FIELD_VALUES,
        MEDICAL_FIELDS,
        MEDICAL_PUBLIC_EXAMPLE,
        KnowledgeConfig,
    )

    # each contributor holds about 130 records: clusters of a few records, so q = 1/2
    config = KnowledgeConfig(
        epsilon=epsilon, delta=1e-5, voters=args.voters, public_pool_size=2 * args.voters,
        fields=MEDICAL_FIELDS, field_values=MEDICAL_FIELD_VALUES,
        public_example=MEDICAL_PUBLIC_EXAMPLE,
    )  # fmt: skip
    folders = []
    for c, corpus in enumerate(corpora):
        out = corpus.parent / f"release-eps{epsilon:g}"
        work = corpus.parent / f"work-eps{epsilon:g}"
        if not (out / "card.json").is_file():
            build_knowledge(
                corpus, out, config, contributor=f"hospital-{c}", work=work, lm=lm,
                answer_index=False, progress=False, lm_name=args.model,
            )  # fmt: skip
        folders.append((out, work))
    return folders


def wait_healthy(servers: list[ContributorProcess]) -> None:
    """Waits for each server's /health (the socket listens before uvicorn accepts)."""
    import httpx

    for server in servers:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)


class ContributorProcess:
    """`retriever contributor serve` as a child process on a port it picks itself."""

    def __init__(self, release: Path, work: Path, log: Path) -> None:
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
        self.log = open(log, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retriever.cli", "contributor", "serve",
             "--dir", str(release), "--work", str(work), "--port", "0"],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )  # fmt: skip
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.start()
        reader.join(180)
        if not line or not line[0].startswith("serving "):
            self.stop()
            raise RuntimeError(f"a contributor did not start (see {log})")
        self.url = line[0].split()[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.log.close()


def network_cell(args, folders, questions, world, epsilon: float, lm) -> list[dict]:
    """Answers every question through the network (resumable); rows with recall."""
    from retriever.encoders import load_encoder
    from retriever.network.engine import Contributor, EngineConfig, NetworkQueryEngine
    from retriever.rag.evaluation import MEDICAL_PROMPT
    from retriever.rag.medical import answer_is_correct
    from retriever.service.contributor import add_key

    path = args.out / "cells" / f"network-eps{epsilon:g}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    if len(done) >= len(questions):
        return done[: len(questions)]
    # The oracle: one exact index over every contributor's synthetic documents.
    encoder = load_encoder("all-minilm-l6-v2")
    union_keys, union_texts = [], []
    for c, (release, _) in enumerate(folders):
        for line in (release / "synthetic.jsonl").read_text().splitlines():
            row = json.loads(line)
            union_keys.append((f"hospital-{c}", row["doc_id"]))
            union_texts.append(row["text"])
    union = encoder.encode(union_texts) if union_texts else np.zeros((0, 1), np.float32)
    contributors, servers = [], []
    try:
        for c, (release, work) in enumerate(folders):
            key_file = work / "network-key.txt"
            if not key_file.is_file():
                key = add_key(work, "network", epsilon=1.0, delta=1e-6,
                              collection_epsilon=epsilon + 10, collection_delta=1e-4)  # fmt: skip
                key_file.write_text(key)
            server = ContributorProcess(release, work, args.out / f"contributor-{c}.log")
            servers.append(server)
            contributors.append(Contributor(server.url, key_file.read_text(), f"hospital-{c}"))
        wait_healthy(servers)
        engine = NetworkQueryEngine(
            contributors,
            config=EngineConfig(k=10, timeout=30, answer_documents=args.k, max_answer_tokens=6),
            lm=lm,
            prompt=MEDICAL_PROMPT,
            lm_name=args.model,
        )
        others = [d.name for d in world.diseases]
        with path.open("a") as sink:
            for i in range(len(done), len(questions)):
                q = questions[i]
                response = engine.query_sync(q.question, k=10, cards=i == len(done))
                got = {(h.contributor, h.doc_id) for h in response.documents}
                if len(union_keys):
                    scores = union @ np.asarray(encoder.encode([q.question]))[0]
                    top = {union_keys[j] for j in np.argsort(-scores)[:10]}
                    recall = len(got & top) / len(top)
                else:
                    recall = None
                row = {
                    "question_index": i,
                    "support": q.support,
                    "answer": response.answer,
                    "correct": answer_is_correct(response.answer or "", q.answer, others=others),
                    "recall_at_10": recall,
                    "ok": sum(r.status == "ok" for r in response.contributors),
                }
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                done.append(row)
    finally:
        for server in servers:
            server.stop()
    return done


def plot(table: dict, refs: dict, epsilons, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(epsilons), figsize=(4 * len(epsilons), 3.6), sharey=True)
    for ax, eps in zip(np.atleast_1d(axes), epsilons):
        net = table[f"{eps:g}"]["network"]
        dprag = [table[f"{eps:g}"]["dprag"][str(q)] for q in QS]
        ax.plot(QS, [net] * len(QS), marker="o", label="network (one release)")
        ran = [(q, a) for q, a in zip(QS, dprag) if a is not None]
        ax.plot([q for q, _ in ran], [a for _, a in ran], marker="s",
                label="query-time DP-RAG (icl; missing: not run)")  # fmt: skip
        ax.axhline(refs["rag"], ls="--", color="gray", label="non-private RAG")
        ax.axhline(refs["no-rag"], ls=":", color="gray", label="no RAG")
        ax.set_xscale("log")
        ax.set_xlabel("questions asked Q")
        ax.set_title(f"total ε = {eps:g} after Q questions")
        ax.set_ylim(-0.02, 1.02)
    np.atleast_1d(axes)[0].set_ylabel("answer accuracy")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FACT_DOMAINS = ("people", "products", "species")
FACT_QUESTIONS, FACT_MIN_SUPPORT, FACT_DELTA = 20, 10, 1e-6


def _text(answer) -> str:
    return answer.answer if hasattr(answer, "answer") else answer


def fact_domain(args, domain: str, lm, prompt) -> dict:
    """One fact world through a network of 3 fact releases: questions right out of 20."""
    from retriever.fact_answers import FactAnswerer
    from retriever.network.engine import Contributor, EngineConfig, NetworkQueryEngine
    from retriever.network.facts import fact_answer, merge_fact_records
    from retriever.network.knowledge import build_knowledge
    from retriever.rag.fact_world import answer_is_right, make_world
    from retriever.service.contributor import add_key
    from synthgen.knowledge.facts import FactConfig

    world = make_world(domain, facts_per_level=args.facts_per_level, seed=0)
    questions = [q for q in world.questions if q.support >= FACT_MIN_SUPPORT][:FACT_QUESTIONS]
    root = args.out / domain
    config = FactConfig(epsilon=args.fact_epsilon, delta=FACT_DELTA)
    folders = []
    for c in range(3):
        corpus = root / f"contributor-{c}" / "private.jsonl"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        corpus.write_text("".join(json.dumps({"doc_id": f"{c}-{i}", "text": t}) + "\n"
                                  for i, t in enumerate(world.documents[c::3])))  # fmt: skip
        out, work = corpus.parent / "release", corpus.parent / "work"
        if not (out / "card.json").is_file():  # its own ledger: <work>/ledger.sqlite
            build_knowledge(corpus, out, config, contributor=f"{domain}-{c}", work=work,
                            answer_index=False, progress=False)  # fmt: skip
        key_file = work / "network-key.txt"
        if not key_file.is_file():
            key_file.write_text(add_key(work, "network", epsilon=1.0, delta=1e-6,
                                        collection_epsilon=1.0, collection_delta=1e-6))  # fmt: skip
        folders.append((out, work, key_file.read_text()))
    union = [[json.loads(x)["text"] for x in (out / "synthetic.jsonl").read_text().splitlines()]
             for out, _, _ in folders]  # fmt: skip
    sigma = max(
        json.loads((out / "card.json").read_text())["guarantee"]["stages"][0].get("noise_stddev", 0)
        for out, _, _ in folders
    )
    if config.extractor == "typed":  # the typed answerer over every record of every release

        def oracle_answer(question: str) -> str:
            return fact_answer(lm, question, union, sigma or None)[0]
    else:
        oracle_answer = FactAnswerer(merge_fact_records(union), lm).answer
    servers = []
    try:
        for c, (out, work, _) in enumerate(folders):
            servers.append(ContributorProcess(out, work, root / f"contributor-{c}.log"))
        wait_healthy(servers)
        engine = NetworkQueryEngine(
            [Contributor(s.url, key, f"{domain}-{c}")
             for c, (s, (_, _, key)) in enumerate(zip(servers, folders))],
            config=EngineConfig(k=10, timeout=120, fact_k=args.fact_k),
            lm=lm, prompt=prompt, lm_name=args.model,
        )  # fmt: skip
        rows = []
        for i, q in enumerate(questions):
            response = engine.query_sync(q.question, cards=i == 0)
            rows.append({
                "question": q.question, "expected": q.answer, "support": q.support,
                "answer": response.answer, "abstained": response.abstained,
                "right": answer_is_right(response.answer or "", q.answer),
                "oracle_right": answer_is_right(_text(oracle_answer(q.question)), q.answer),
                "ok": sum(r.status == "ok" for r in response.contributors),
            })  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    cards = [json.loads((out / "card.json").read_text()) for out, _, _ in folders]
    return {
        "right": sum(r["right"] for r in rows),
        "oracle_right": sum(r["oracle_right"] for r in rows),
        "abstained": sum(r["abstained"] for r in rows),
        "questions": len(rows),
        "records": [c["releases"]["synthetic_documents"] for c in cards],
        "card_epsilons": [c["guarantee"]["epsilon"] for c in cards],
        "rows": rows,
    }


def facts_main(args) -> None:
    """``--facts``: the fact worlds through 3 contributors' fact releases (module docstring)."""
    from retriever.network.engine import load_answer_lm

    args.out.mkdir(parents=True, exist_ok=True)
    lm, prompt = load_answer_lm(args.model)
    results = {}
    for domain in args.fact_domains:
        start = time.monotonic()
        results[domain] = cell = fact_domain(args, domain, lm, prompt)
        print(
            f"{domain}: right {cell['right']}/{cell['questions']} (abstained "
            f"{cell['abstained']}; whole releases {cell['oracle_right']}/{cell['questions']}; "
            f"records {cell['records']}; {time.monotonic() - start:.0f} s)",
            flush=True,
        )
    (args.out / "facts_results.json").write_text(json.dumps(results, indent=1))
    tests = [d for d in args.fact_domains if d != "people"] or list(args.fact_domains)
    low = min(tests, key=lambda d: results[d]["right"])
    print(
        f"network_right={results[low]['right']}/{results[low]['questions']} ({low}) "
        + " ".join(f"{d}={results[d]['right']}/{results[d]['questions']}" for d in results)
        + f" epsilon={args.fact_epsilon:g} contributors=3"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/network_demo"))
    parser.add_argument("--voters", type=int, default=32, help="release: M voters")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    parser.add_argument("--questions-per-disease", type=int, default=1)
    parser.add_argument("--k", type=int, default=8, help="documents in the answer prompt")
    parser.add_argument(
        "--min-answer-epsilon",
        type=float,
        default=1.0,
        help="DP-RAG cells below this per-answer epsilon are not run (reported as such): "
        "their noisy threshold selects most records, so one answer takes minutes, and a "
        "token epsilon below 0.2 cannot single out a token among 49,152",
    )
    parser.add_argument("--facts", action="store_true", help="the fact release (see above)")
    parser.add_argument("--fact-epsilon", type=float, default=10.0)
    parser.add_argument("--fact-domains", nargs="+", choices=FACT_DOMAINS, default=FACT_DOMAINS)
    parser.add_argument("--facts-per-level", type=int, default=7)
    parser.add_argument("--fact-k", type=int, default=20, help="records asked of each")
    args = parser.parse_args()
    if args.facts:
        facts_main(args)
        return

    from retriever.rag import AggregationConfig, RagConfig, ScoreRange
    from retriever.rag.evaluation import EvalConfig, accuracy_table, evaluate_world, make_rag
    from retriever.rag.medical import MedicalWorldConfig, make_world
    from synthgen.lm_backends import FlaxLM

    args.out.mkdir(parents=True, exist_ok=True)
    world = make_world(MedicalWorldConfig(num_diseases=20, num_records=400, seed=0))
    questions = world.questions(per_disease=args.questions_per_disease, seed=0)
    corpora = split_world(world, args.out, 3)
    lm = FlaxLM.load(args.model)
    table, cards = {}, {}
    for eps in args.epsilons:
        print(f"building the 3 releases at epsilon={eps:g}", file=sys.stderr, flush=True)
        folders = build_all(args, corpora, eps, lm)
        cards[f"{eps:g}"] = [json.loads((r / "card.json").read_text()) for r, _ in folders]
        print(f"asking {len(questions)} questions through the network", file=sys.stderr)
        rows = network_cell(args, folders, questions, world, eps, lm)
        recalls = [r["recall_at_10"] for r in rows if r["recall_at_10"] is not None]
        table[f"{eps:g}"] = {
            "network": float(np.mean([r["correct"] for r in rows])),
            "recall_at_10": float(np.mean(recalls)) if recalls else None,
            "card_epsilons": [c["guarantee"]["epsilon"] for c in cards[f"{eps:g}"]],
            "synthetic_documents": [
                c["releases"]["synthetic_documents"] for c in cards[f"{eps:g}"]
            ],
        }
    # Query-time DP-RAG at per-answer epsilon total / Q (basic composition), same questions.
    per_answer = sorted({round(e / q, 6) for e in args.epsilons for q in QS} - {0.0})
    per_answer = [e for e in per_answer if e >= args.min_answer_epsilon]
    rag_config = RagConfig(
        k=16, max_tokens=6, score_range=ScoreRange(0.2, 1.0), composition="bounded-range",
        aggregation=AggregationConfig(),
    )  # fmt: skip
    rag = make_rag(world, args.out / "dprag", lm=lm, config=rag_config, seed=0)
    results = evaluate_world(
        world, questions, rag,
        EvalConfig(epsilons=tuple(per_answer), mechanisms=("icl",), rag_k=16),
        args.out / "dprag",
    )  # fmt: skip
    acc = {e["cell"]: e["accuracy"] for e in accuracy_table(results)}
    refs = {"rag": acc["rag"], "no-rag": acc["no-rag"]}
    for eps in args.epsilons:
        table[f"{eps:g}"]["dprag"] = {str(q): acc.get(f"icl-eps{round(eps / q, 6):g}") for q in QS}
    lines = [
        "| total ε | network (any Q) | DP-RAG Q=1 | Q=10 | Q=100 | Q=1000 | "
        "network Recall@10 | synthetic docs | card ε (3 contributors) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for eps in args.epsilons:
        t = table[f"{eps:g}"]
        recall = "–" if t["recall_at_10"] is None else f"{t['recall_at_10']:.2f}"
        lines.append(
            f"| {eps:g} | {t['network']:.2f} | "
            + " | ".join(
                "not run" if t["dprag"][str(q)] is None else f"{t['dprag'][str(q)]:.2f}" for q in QS
            )
            + f" | {recall} | {sum(t['synthetic_documents'])} | "
            + ", ".join(f"{e:.2f}" for e in t["card_epsilons"])
            + " |"
        )
    lines.append(f"\nno-RAG {refs['no-rag']:.2f}, non-private RAG {refs['rag']:.2f} "
                 f"({len(questions)} questions)")  # fmt: skip
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(
        json.dumps(
            {"table": table, "references": refs, "cards": cards, "questions": len(questions)},
            indent=1,
        )  # fmt: skip
    )
    plot(table, refs, args.epsilons, args.out / "network.png")
    print("\n".join(lines))
    best_net = max(t["network"] for t in table.values())
    ran = [t["dprag"]["1000"] for t in table.values() if t["dprag"]["1000"] is not None]
    best_q1000 = f"{max(ran):.3f}" if ran else "not-run"
    print(
        f"network_best={best_net:.3f} dprag_q1000_best={best_q1000} "
        f"rag={refs['rag']:.3f} no_rag={refs['no-rag']:.3f}"
    )


if __name__ == "__main__":
    main()
