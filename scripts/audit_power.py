"""The audit-power table of issue 52: can each audit see a leak? White-box and black-box cells.

Runs `dpsynth.evaluation.querygen_audit_power`: per claimed epsilon (inf = no noise, 8, 3, 1),
one DP step of a
project query generator with m canary gradients (`synthgen.audit.whitebox`); and per
black-box epsilon (inf, 8), the generator trained by `dp_train.train` on private pairs plus
m canaries whose secrets are new tokens (or the rarest tokens), scored on the final model
(`synthgen.audit.blackbox`). It prints Markdown tables and, last, exactly one line of
space-separated `key=value` pairs: `nonprivate_eps_lb`, `dp8_eps_lb` (black-box),
`whitebox_nonprivate_eps_lb`, `whitebox_dp8_eps_lb`, `cap`. A cell not run prints `nan`.
Resumable: a cell whose result file exists in --out is read back, not run.

    python scripts/audit_power.py --out runs/audit_power            # demo LoRA generator
    python scripts/audit_power.py --quick --out /tmp/audit_power    # tiny T5, a few minutes
    python scripts/audit_power.py --config audit.yaml --out runs/audit  # = synthgen audit power

With --config, the config's few-shot, Private Evolution and DP-RAG cells run too
(`power_audit.run_generators`; their table is printed before the last line). Besides the
tables it writes the ROC plot, the score histograms and power_audit.json
(`dpsynth.evaluation.audit_power`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpsynth.evaluation import audit_power, querygen_audit_power
from dpsynth.evaluation.rag_audit_power_cells import generator_runners
from synthgen.audit import blackbox
from synthgen.audit.claims import parse_epsilons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="results folder (resumable)")
    parser.add_argument("--config", type=Path, help="a power audit config (YAML or JSON)")
    parser.add_argument("--quick", action="store_true", help="the tiny T5 generator (tests)")
    parser.add_argument(
        "--model", choices=querygen_audit_power.MODELS, help="default: demo_lora, tiny_t5 quick"
    )
    parser.add_argument("--canaries", type=int, default=1000, help="m per cell (default 1000)")
    parser.add_argument("--epsilons", default="inf,8,3,1", help="white-box claimed epsilons")
    parser.add_argument("--blackbox-epsilons", default="inf,8", help="black-box claimed epsilons")
    parser.add_argument("--blackbox-kind", choices=blackbox.KINDS, default="new")
    parser.add_argument("--blackbox-canaries", type=int, default=None, help="default --canaries")
    parser.add_argument("--skip-whitebox", action="store_true")
    parser.add_argument("--skip-blackbox", action="store_true")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=None, help="fixed audit seed: tests only")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.config is not None:
            config = audit_power.load_config(args.config)
        else:
            config = audit_power.PowerAuditConfig(
                model=args.model or ("tiny_t5" if args.quick else "demo_lora"),
                canaries=args.canaries,
                whitebox_epsilons=() if args.skip_whitebox else parse_epsilons(args.epsilons),
                blackbox_epsilons=(
                    () if args.skip_blackbox else parse_epsilons(args.blackbox_epsilons)
                ),
                blackbox_kind=args.blackbox_kind,
                blackbox_canaries=args.blackbox_canaries,
                delta=args.delta,
            )
        results, bb_results = audit_power.run(config, args.out, seed=args.seed, log=log)
        generators = audit_power.run_generators(
            config, args.out, seed=args.seed, log=log, **generator_runners(config)
        )
    except (ValueError, ImportError) as exc:
        print(f"audit_power: {exc}", file=sys.stderr)
        return 2
    audit_power.write_report(config, results, bb_results, args.out, generators)
    if results:
        print(querygen_audit_power.format_table(results))
    if bb_results:
        print(querygen_audit_power.format_blackbox_table(bb_results))
    if generators:
        print(audit_power.format_generators_table(generators))
    for line in audit_power.violations([*results, *bb_results, *generators]):
        print(line, file=sys.stderr)
    print(
        ("black-box cells not run yet: nan; " if not bb_results else "")
        + "every key is the one-run epsilon-count bound (black-box: the secret's log-ratio; "
        f"white-box: the noisy gradient), delta={config.delta:g}, 95%"
    )
    print(querygen_audit_power.summary_line(results, bb_results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
