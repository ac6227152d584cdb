"""scripts/fewshot_utility.py: one ledger scope with the guide run, no timings released."""

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "fewshot_utility", ROOT / "scripts" / "fewshot_utility.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guide_generate_docs() -> dict[str, str]:
    """Options of the few-shot guide's `synthgen generate-docs` command."""
    section = (ROOT / "docs" / "guides" / "fewshot.md").read_text()
    block = section[section.index("```bash") : section.index("```", section.index("```bash") + 3)]
    command = block[block.index("synthgen generate-docs") :].split("\n# ")[0]
    words = shlex.split(command.replace("\\\n", " "))
    return {w[2:]: v for w, v in zip(words, words[1:] + [""]) if w.startswith("--")}


def test_the_script_and_the_guide_run_charge_one_scope(script, monkeypatch, tmp_path):
    # The same private data (the wiki train split) must compose in one ledger scope: the
    # default ledger, the guide command's tenant/dataset, cap and declared figures.
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.sqlite"))
    args = script.parse_args([])
    guide = _guide_generate_docs()
    assert "ledger" not in guide and args.ledger == tmp_path / "ledger.sqlite"
    assert (args.tenant, args.dataset) == (guide["tenant"], guide["dataset"])
    assert args.budget == float(guide["budget"])
    assert args.public_pool_size == int(guide["public-pool-size"])
    assert guide["labels"].split(",") == sorted(script.WIKI_TOPICS)
    assert guide["split"] == "train"


@pytest.mark.slow
def test_the_guide_states_the_composed_total(script):
    # Recompute the guide's total from declared figures only: the guide command's plan and
    # the script's default cells (few-shot and Private Evolution), composed (PLD) at the
    # shared delta. ~40 s (calibrations).
    from synthgen import fewshot
    from synthgen.privacy import accounting

    guide, args = _guide_generate_docs(), script.parse_args([])
    labels = guide["labels"].split(",")
    run = fewshot.FewShotConfig(
        public_pool_size=int(guide["public-pool-size"]), subsets=int(guide["subsets"]),
        shots=int(guide["shots"]), max_new_tokens=int(guide["max-new-tokens"]),
        target_epsilon=float(guide["epsilon"]), public_vocab=int(guide["public-vocab"]),
    )  # fmt: skip
    per_pool = -(-int(guide["num-examples"]) // len(labels))
    plans = [fewshot.plan_privacy(run, per_pool * run.max_new_tokens, len(labels))]
    for eps in args.epsilons:
        cell = fewshot.FewShotConfig(
            public_pool_size=args.public_pool_size, subsets=args.subsets, shots=args.shots,
            max_new_tokens=args.max_new_tokens, target_epsilon=eps,
            public_vocab=args.public_vocab,
        )  # fmt: skip
        plans.append(fewshot.plan_privacy(cell, args.per_label * cell.max_new_tokens, 12))
    plans += [script.plan_pe(args, labels, eps) for eps in args.epsilons]  # the PE cells
    assert len({plan.delta for plan in plans}) == 1
    total = accounting.epsilon(accounting.compose([p.event for p in plans]), plans[0].delta)
    assert total <= args.budget
    section = (ROOT / "docs" / "guides" / "fewshot.md").read_text()
    stated = re.search(r"ε = (\d+\.\d+) at δ = 1/([\d,]+)", section)
    assert float(stated.group(1)) == pytest.approx(total, abs=0.005)
    assert 1 / int(stated.group(2).replace(",", "")) == pytest.approx(plans[0].delta)


def test_cells_hold_no_timings(script, tmp_path):
    cell = script._cell(tmp_path, "synthetic-1", lambda: {"epsilon": 1.0, "accuracy": 0.5})
    stored = json.loads((tmp_path / "cells" / "synthetic-1.json").read_text())
    assert stored == cell == {"epsilon": 1.0, "accuracy": 0.5, "cell": "synthetic-1"}
