"""Canary audit of the DP-RAG answer stage: how often a planted secret appears in answers.

Plants canary documents ``"The access code of <key words> is <10-digit secret>."`` in a
fictional medical collection (`dpsynth.evaluation.medical_world`), asks for each code, and
prints one
row per per-answer epsilon (inf: the non-private RAG baseline) with the share of answers
that reveal the full secret and the mean length of the secret's prefix found in them
(`retriever.rag.canary_audit.run_rag_canary_audit`).

    python scripts/audit_rag.py                          # inf,10,3,1; smollm2-135m-instruct
    python scripts/audit_rag.py --canaries 4 --answers 1 --work-dir /tmp/private-audit

The secrets go to --work-dir (a private folder, mode 0700) only; the table and --json hold
aggregate figures.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
from retriever.rag import RagConfig
from retriever.rag.canary_audit import markdown_table, run_rag_canary_audit


def _epsilons(text: str) -> tuple[float, ...]:
    return tuple(math.inf if t.strip() == "inf" else float(t) for t in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilons", type=_epsilons, default=(math.inf, 10.0, 3.0, 1.0))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--encoder", default="all-minilm-l6-v2")
    parser.add_argument("--documents", type=int, default=40, help="medical records")
    parser.add_argument("--canaries", type=int, default=6)
    parser.add_argument("--answers", type=int, default=2, help="DP answers per canary")
    parser.add_argument(
        "--mechanism",
        default="icl",
        choices=["icl", "keywords", "facts"],
    )
    parser.add_argument("--k", type=int, default=1, help="documents the DP threshold aims at")
    parser.add_argument("--baseline-k", type=int, default=1, help="documents in the baseline")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None, help="tests only: fixed randomness")
    parser.add_argument("--work-dir", type=Path, default=None, help="private canary record")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    from retriever.encoders import load_encoder
    from synthgen.lm_backends import FlaxLM

    world = make_world(
        MedicalWorldConfig(num_records=args.documents, num_diseases=5, symptom_pool=20, seed=0)
    )
    audit = run_rag_canary_audit(
        [r.text for r in world.records],
        lm=FlaxLM.load(args.model),
        encode=load_encoder(args.encoder).encode,
        config=RagConfig(k=args.k, max_tokens=args.max_tokens),
        epsilons=args.epsilons,
        canaries=args.canaries,
        answers_per_canary=args.answers,
        mechanism=args.mechanism,
        baseline_k=args.baseline_k,
        seed=args.seed,
        work_dir=args.work_dir,
        progress=True,
    )
    print(markdown_table(audit))
    if args.json is not None:
        args.json.write_text(json.dumps(audit, indent=1))


if __name__ == "__main__":
    main()
