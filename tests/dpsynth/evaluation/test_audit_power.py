"""scripts/audit_power.py: last-line contract, resumability, no coins in any output file."""

import importlib.util
import json
import math
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from dpsynth.evaluation import querygen_audit_power
from synthgen.audit import whitebox
from tests.synthgen.audit.coin_leaks import check_no_coins

SCRIPT = Path(__file__).parents[3] / "scripts" / "audit_power.py"
LAST_LINE = re.compile(
    r"nonprivate_eps_lb=nan dp8_eps_lb=nan whitebox_nonprivate_eps_lb=([0-9.]+) "
    r"whitebox_dp8_eps_lb=([0-9.]+) cap=([0-9.]+)"
)
SEED = 11
CANARIES = 300


def _loss(trainable, frozen, example):
    return jnp.mean(jnp.square(example["x"] @ trainable["w"] - example["y"]))


def _toy_model(name: str) -> querygen_audit_power.AuditedModel:
    rng = np.random.default_rng(0)
    return querygen_audit_power.AuditedModel(
        name=name,
        description="toy (linear 64x256)",
        loss_fn=_loss,
        tapped_loss_fn=None,
        trainable={"w": (0.1 * rng.normal(size=(64, 256))).astype(np.float32)},
        frozen={},
        batch={
            "x": rng.normal(size=(8, 64)).astype(np.float32),
            "y": rng.normal(size=(8, 256)).astype(np.float32),
        },
        lora=False,
        clip_norm=1.0,
        learning_rate=1e-2,
        microbatch=4,
    )


@pytest.fixture
def script(monkeypatch):
    """The script's main() with the toy model in place of the query generators."""
    monkeypatch.setattr(querygen_audit_power, "load_model", _toy_model)
    # The black-box cells train a real generator: `test_blackbox.py` runs them.
    monkeypatch.setattr(querygen_audit_power, "run_blackbox_cells", lambda *a, **k: [])
    spec = importlib.util.spec_from_file_location("audit_power_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _run(main, out: Path, capsys) -> list[str]:
    args = ["--out", str(out), "--quick", "--epsilons", "inf,8", "--canaries", str(CANARIES)]
    assert main([*args, "--seed", str(SEED)]) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_last_line_and_resume(script, tmp_path, capsys, monkeypatch):
    lines = _run(script, tmp_path, capsys)
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    nonprivate, dp8, cap = map(float, match.groups())
    assert nonprivate >= 0.9 * cap  # the planted leak: no noise reaches the cap
    assert 0 <= dp8 <= 8.0
    assert "not run yet" in lines[-2]
    assert {p.name for p in tmp_path.iterdir()} == {
        f"whitebox_tiny_t5_m{CANARIES}_eps8.json",
        f"whitebox_tiny_t5_m{CANARIES}_epsinf.json",
        "whitebox_table.md",
        "roc.png",
        "histograms.png",
        "power_audit.json",
    }
    report = json.loads((tmp_path / "power_audit.json").read_text())
    assert report["summary"] == lines[-1]
    for cell in report["whitebox"]:
        stats = cell["stats"][0]
        assert len(stats["roc_tpr"]) == len(whitebox.ROC_FPR)
        assert sum(stats["histogram_in"]) == cell["num_in"]
        assert sum(stats["histogram_out"]) == cell["num_out"]
    # no noise: every included canary scores above every excluded one
    assert float(report["whitebox"][0]["claimed_epsilon"]) == math.inf  # "inf" in JSON
    assert report["whitebox"][0]["stats"][0]["roc_tpr"][0] == 1.0
    # Resumable: a second run reads the cells back and computes nothing.
    monkeypatch.setattr(whitebox, "audit_dp_step", lambda *a, **k: pytest.fail("recomputed"))
    assert _run(script, tmp_path, capsys)[-1] == lines[-1]


def test_inclusion_coins_never_reach_an_output_file(script, tmp_path, capsys):
    _run(script, tmp_path, capsys)
    # The coins of cell k, recomputed here from the test seed (seed + k) exactly as
    # whitebox.audit_dp_step draws them; they must not appear in any form in any file.
    coins = []
    for k in range(2):
        _, coin_key, _ = whitebox._streams(SEED + k)
        coins.append(np.asarray(whitebox.jax.random.bernoulli(coin_key, 0.5, (CANARIES,))))
    records = check_no_coins(tmp_path.rglob("*"), coins, "whitebox_", whitebox.WhiteboxResult)
    for record in records:
        assert record["num_in"] + record["num_out"] == CANARIES
        assert record["target_epsilon"] in (8.0, math.inf)


def test_summary_line_without_cells():
    assert querygen_audit_power.summary_line([]) == (
        "nonprivate_eps_lb=nan dp8_eps_lb=nan whitebox_nonprivate_eps_lb=nan "
        "whitebox_dp8_eps_lb=nan cap=nan"
    )


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        querygen_audit_power.load_model("gpt-5")


def test_synthgen_audit_power_runs_one_config(monkeypatch, tmp_path, capsys):
    """`synthgen audit power --config FILE`: the cells the config names, the tables, the
    plots and the summary line, as the script writes them."""
    from dpsynth.cli.synthgen import app
    from synthgen.command_line import run

    monkeypatch.setattr(querygen_audit_power, "load_model", _toy_model)
    monkeypatch.setattr(querygen_audit_power, "run_blackbox_cells", lambda *a, **k: [])
    config = tmp_path / "audit.yaml"
    config.write_text(
        f"model: tiny_t5\ncanaries: {CANARIES}\nwhitebox_epsilons: [inf]\nblackbox_epsilons: []\n"
    )
    out = tmp_path / "out"
    assert run(app, ["audit", "power", "--config", str(config), "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("nonprivate_eps_lb=nan dp8_eps_lb=nan whitebox_nonprivate_eps_lb=")
    assert {"roc.png", "histograms.png", "whitebox_table.md", "power_audit.json"} <= {
        p.name for p in out.iterdir()
    }
    config.write_text("model: tiny_t5\nepsilons: [1]\n")
    assert run(app, ["audit", "power", "--config", str(config), "--out", str(out)]) == 1
    assert "unknown fields ['epsilons']" in capsys.readouterr().err


def test_one_config_runs_the_other_generators_cells(monkeypatch, tmp_path, capsys):
    """`synthgen audit power` with `evolution_epsilons` and `rag_epsilons`: retriever's
    runners are supplied by the entry point, the cells land in `generators_table.md` and
    `power_audit.json` (aggregates only), and the summary line is unchanged."""
    from dpsynth.cli.synthgen import app
    from dpsynth.evaluation import audit_power
    from dpsynth.evaluation import rag_audit_power_cells as rag_power
    from synthgen.audit import release_audit
    from synthgen.command_line import run

    rag_calls = []

    def rag_cells(out_dir, epsilons, *, canaries, seed, log):
        rag_calls.append((tuple(epsilons), canaries))
        return []

    monkeypatch.setattr(
        rag_power,
        "generator_runners",
        lambda cfg: {"embed": release_audit.word_embedding, "rag_cells": rag_cells},
    )
    monkeypatch.setattr(audit_power, "EVOLUTION_SETTINGS", dict(num_private=30, num_samples=200))
    config = tmp_path / "audit.yaml"
    config.write_text(
        "canaries: 60\nwhitebox_epsilons: []\nblackbox_epsilons: []\n"
        "evolution_epsilons: inf\nrag_epsilons: [inf, 8]\n"
    )
    out = tmp_path / "out"
    assert run(app, ["audit", "power", "--config", str(config), "--out", str(out)]) == 0
    assert rag_calls == [((math.inf, 8.0), 60)]
    table = (out / "generators_table.md").read_text()
    assert "Private Evolution" in table and table.count("\n") == 3
    report = json.loads((out / "power_audit.json").read_text())
    (cell,) = report["generators"]
    assert cell["num_canaries"] == 60 and cell["num_in"] + cell["num_out"] == 60
    assert math.isinf(audit_power.load_config(config).evolution_epsilons[0])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("nonprivate_eps_lb=nan")


def test_generator_cells_need_their_runners(tmp_path):
    from dpsynth.evaluation import audit_power

    config = audit_power.PowerAuditConfig(whitebox_epsilons=(), rag_epsilons=(8.0,))
    with pytest.raises(ValueError, match="rag_cells"):
        audit_power.run_generators(config, tmp_path)
    config = audit_power.PowerAuditConfig(whitebox_epsilons=(), evolution_epsilons=(8.0,))
    with pytest.raises(ValueError, match="encoder"):
        audit_power.run_generators(config, tmp_path)


def test_blackbox_epochs_reach_the_cells_and_their_file_names(tmp_path):
    """`blackbox_epochs` is passed to the black-box runs, and a non-default value keys the
    cell's file, so a 3-epoch cell never reads back a 1-epoch one."""
    from dpsynth.evaluation import audit_power

    config_file = tmp_path / "audit.yaml"
    config_file.write_text(
        "whitebox_epsilons: []\nblackbox_epsilons: [8]\nblackbox_epochs: 3\n"
        "blackbox_batch_size: 512\n"
    )
    config = audit_power.load_config(config_file)
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            querygen_audit_power, "run_blackbox_cells", lambda *a, **k: calls.append(k) or []
        )
        audit_power.run(config, tmp_path)
    assert calls[0]["epochs"] == 3.0 and calls[0]["batch_size"] == 512

    cell_path = querygen_audit_power.blackbox_cell_path
    default = cell_path(tmp_path, "demo_lora", "new", 1000, 8.0, 1.0)
    assert default.name == "blackbox_demo_lora_new_m1000_eps8.json"
    assert cell_path(tmp_path, "demo_lora", "new", 1000, 8.0) == default
    three = cell_path(tmp_path, "demo_lora", "new", 1000, 8.0, 3.0)
    assert three.name == "blackbox_demo_lora_new_m1000_ep3_eps8.json"
    big = cell_path(tmp_path, "demo_lora", "new", 1000, 8.0, 3.0, 512)
    assert big.name == "blackbox_demo_lora_new_m1000_ep3_b512_eps8.json"
    preset_batch = cell_path(tmp_path, "demo_lora", "new", 1000, 8.0, 1.0, 32)
    assert preset_batch == default  # the preset's own batch is the default, untagged
    with pytest.raises(ValueError, match="blackbox_epochs"):
        audit_power.PowerAuditConfig(blackbox_epochs=0.0)
    with pytest.raises(ValueError, match="blackbox_batch_size"):
        audit_power.PowerAuditConfig(blackbox_batch_size=0)
    with pytest.raises(ValueError, match="blackbox_batch_size"):
        audit_power.PowerAuditConfig(blackbox_batch_size=512.0)
