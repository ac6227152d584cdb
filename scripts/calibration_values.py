"""Every calibrated DP parameter on a grid of inputs, as JSON: run it before and after a
change to the calibration code and compare (`--compare OLD.json`).

Each line of the grid calls a public calibration of the toolkit (DP-SGD's noise, the
few-shot noise and per-token epsilon, the nearest-neighbour histogram's noise, the zCDP cap,
the records a fact release needs, the DP-RAG per-token epsilon and answer plans) the way its
callers do, so a refactor that changes any calibrated value shows here.

    python scripts/calibration_values.py --out runs/calibration_before.json
    python scripts/calibration_values.py --compare runs/calibration_before.json   # exit 1: moved
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def values() -> dict[str, float]:
    from retriever.rag import accounting as rag_accounting
    from retriever.rag.config import RagConfig
    from retriever.rag.one_run_audit import answer_epsilon_for
    from retriever.rag.plan import make_plan
    from synthgen.knowledge.facts import FactConfig, plan_facts
    from synthgen.privacy.dpsgd_accounting import calibrate_noise_multiplier
    from synthgen.privacy.fewshot_accounting import calibrate_fewshot
    from synthgen.privacy.individual import rho_cap
    from synthgen.privacy.nn_histogram import calibrate_nn_histogram

    out: dict[str, float] = {}
    for eps, n, b, steps in ((8.0, 96, 16, 6), (3.0, 1600, 64, 75), (0.5, 1000, 50, 40)):
        out[f"dpsgd eps={eps} n={n}"] = calibrate_noise_multiplier(
            target_epsilon=eps, delta=1e-5, num_examples=n, batch_size=b, steps=steps
        )
    for eps in (1.0, 4.0):
        out[f"fewshot gaussian eps={eps}"] = calibrate_fewshot(
            target_epsilon=eps, delta=1e-5, sampling_rate=0.05, tokens=50
        )
        out[f"fewshot rnm eps={eps}"] = calibrate_fewshot(
            target_epsilon=eps, delta=1e-5, sampling_rate=0.05, tokens=50, mechanism="rnm"
        )
    for eps, it in ((1.0, 3), (8.0, 10)):
        out[f"nn_histogram eps={eps} it={it}"] = calibrate_nn_histogram(eps, 1e-5, it)
    for eps in (0.5, 10.0):
        out[f"rho_cap eps={eps}"] = rho_cap(eps, 1e-6)
    for eps, k in ((10.0, 1), (3.0, 6)):
        plan = plan_facts(FactConfig(epsilon=eps, delta=1e-6, max_pairs=k), 2000)
        for p in (0.5, 0.9):
            out[f"facts records_needed eps={eps} k={k} p={p}"] = plan.records_needed(p)
    for eps0, tokens in ((0.1, 20), (0.5, 8)):
        out[f"bounded_range nonadaptive eps0={eps0} T={tokens}"] = (
            rag_accounting.bounded_range_epsilon(eps0, tokens, 1e-5, adaptive=False)
        )
    for composition in ("pure", "bounded-range"):
        for target in (1.0, 5.0):
            out[f"token_epsilon {composition} target={target}"] = (
                rag_accounting.calibrate_token_epsilon(
                    target, 16, 1e-5, retrieval_epsilon=0.1, composition=composition
                )
            )
    config = RagConfig(accounting="individual", retrieval_share=0.0)
    for mechanism in ("icl", "keywords", "facts"):  # _largest (retriever.rag.plan)
        for eps in (1.0, 5.0):
            plan = make_plan(mechanism, eps, delta=1e-5, max_tokens=8)
            out[f"plan {mechanism} eps={eps} token_epsilon"] = plan.token_epsilon
            out[f"plan {mechanism} eps={eps} worst_case"] = plan.worst_case_epsilon()
    for rho in (0.05, 0.5):
        out[f"answer_epsilon_for rho={rho}"] = answer_epsilon_for(config, rho)
    return {k: float(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the values here (JSON)")
    parser.add_argument("--compare", type=Path, help="compare with values written before")
    args = parser.parse_args(argv)
    now = values()
    if args.out:
        args.out.write_text(json.dumps(now, indent=1) + "\n")
    moved = 0
    old = json.loads(args.compare.read_text()) if args.compare else {}
    for key, value in now.items():
        before = old.get(key)
        same = before is not None and (before == value or math.isclose(before, value, rel_tol=0))
        mark = "" if not args.compare else ("  same" if same else f"  MOVED from {before!r}")
        moved += bool(args.compare) and not same
        print(f"{key}: {value!r}{mark}")
    if args.compare:
        print(f"calibrations={len(now)} moved={moved}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
