"""Black-box canaries with power: encoding, the vocabulary extension, a planted leak, DP claims,
and no inclusion coin in any output file (tiny T5 through scripts/audit_power.py)."""

import contextlib
import importlib.util
import io
import json
import math
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from dpsynth.evaluation import querygen_audit_power
from synthgen import dp_train
from synthgen.audit import blackbox, new_tokens
from synthgen.audit.coins import draw_coins, streams
from synthgen.generator_models import LlamaFamily
from synthgen.models.llama import Llama, LlamaConfig
from tests.synthgen.audit.coin_leaks import check_no_coins

SCRIPT = Path(__file__).parents[3] / "scripts" / "audit_power.py"
LAST_LINE = re.compile(
    r"nonprivate_eps_lb=([0-9.]+) dp8_eps_lb=([0-9.]+) whitebox_nonprivate_eps_lb=nan "
    r"whitebox_dp8_eps_lb=nan cap=([0-9.]+)"
)
SEED = 5
CANARIES = 300


class _Bytes:
    """A byte-level tokenizer (ids 3..258), enough for the Llama family's encoding."""

    eos_id, pad_id, bos_id = 1, 0, 2
    vocab_size = 259

    def encode(self, text):
        return [3 + b for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny_llama():
    config = LlamaConfig.tiny(vocab_size=_Bytes.vocab_size, lora_rank=2)
    ids = np.zeros((1, 4), np.int32)
    params = Llama(config).init(jax.random.key(0), ids)["params"]
    return LlamaFamily(config, _Bytes()), params


def _canaries(family, kind="new", m=4):
    config = blackbox.BlackboxConfig(num_canaries=m, kind=kind, seed=1)
    return blackbox.make_canaries(
        family,
        [f"document number {i}" for i in range(m)],
        [f"query {i} words" for i in range(m)],
        config,
        np.random.default_rng(0),
        base_vocab=family.config.vocab_size,
        target_len=12,
        pool=np.arange(10, 20),
    )


def test_canary_rows_end_in_their_secret(tiny_llama):
    family, params = tiny_llama
    canaries = _canaries(family)
    ext = new_tokens.extend_vocabulary(
        family, params, canaries.num_new, lora=True, rng=np.random.default_rng(0)
    )
    rows = blackbox.encode_canaries(ext.family, canaries, input_len=48, target_len=12)
    v = family.config.vocab_size
    used = sorted(t for s in canaries.secrets for t in s)
    assert used == list(range(v, v + canaries.num_new))  # one new token per secret position
    for i, (prefix, secret) in enumerate(zip(canaries.prefixes, canaries.secrets, strict=True)):
        assert 1 <= len(secret) <= 3
        target = [*prefix, *secret, _Bytes.eos_id]
        n = len(target)
        assert rows["targets"][i, :n].tolist() == target
        assert rows["target_mask"][i].sum() == n
        assert rows["targets"][i][rows["secret_mask"][i] > 0].tolist() == list(secret)
        start = int(rows["target_start"][i]) + 1  # the decoder reads the target after the prompt
        assert rows["tokens"][i, start : start + n].tolist() == target
        assert rows["attention_mask"][i].sum() == start + n
    # The new rows are trainable leaves beside the adapters; the model sees V + K tokens.
    assert set(ext.trainable) == {"model", "new"}
    assert ext.trainable["new"]["embedding"].shape == (canaries.num_new, family.config.hidden_size)
    full = ext.full_params(ext.trainable)
    assert full["embed"]["embedding"].shape[0] == v + canaries.num_new
    data = {k: v[:1] for k, v in rows.items() if k != "secret_mask"}
    example = {k: v[0] for k, v in data.items()}
    loss = ext.loss_fn()(ext.trainable, ext.frozen, example)
    assert np.isfinite(float(loss))
    grads = jax.grad(ext.loss_fn())(ext.trainable, ext.frozen, example)
    secret_rows = np.asarray(canaries.secrets[0]) - v
    norms = np.linalg.norm(np.asarray(grads["new"]["embedding"]), axis=1)
    assert norms[secret_rows].min() > 10 * np.delete(norms, secret_rows).max()


def test_no_new_tokens_is_the_generator_itself(tiny_llama):
    family, params = tiny_llama
    canaries = _canaries(family, kind="rare")
    assert canaries.num_new == 0
    assert all(10 <= t < 20 for s in canaries.secrets for t in s)
    ext = new_tokens.extend_vocabulary(family, params, 0, lora=True, rng=np.random.default_rng(0))
    rows = blackbox.encode_canaries(family, canaries, input_len=48, target_len=12)
    example = {k: v[0] for k, v in rows.items() if k != "secret_mask"}
    trainable, frozen = ext.trainable["model"], ext.frozen
    np.testing.assert_allclose(
        float(ext.loss_fn()(ext.trainable, frozen, example)),
        float(family.loss_fn()(trainable, frozen, example)),
        rtol=1e-6,
    )


def test_config_is_validated():
    with pytest.raises(ValueError, match="kind"):
        blackbox.BlackboxConfig(kind="digits")
    with pytest.raises(ValueError, match="no_clipping"):
        blackbox.BlackboxConfig(epsilon=8.0, no_clipping=True)
    with pytest.raises(ValueError, match="delta"):
        blackbox.BlackboxConfig(num_canaries=1000, delta=1e-3)
    with pytest.raises(ValueError, match="batch_size"):
        blackbox.BlackboxConfig(batch_size=0)


def test_run_config_takes_the_cells_sizes():
    preset = dp_train.DPConfig(batch_size=32, learning_rate=2e-3, epochs=1.0)
    run = blackbox.run_config(preset, blackbox.BlackboxConfig(epsilon=8.0, epochs=3.0), 1)
    assert (run.batch_size, run.epochs, run.target_epsilon) == (32, 3.0, 8.0)
    cell = blackbox.BlackboxConfig(epsilon=math.inf, batch_size=512, learning_rate=1e-2)
    run = blackbox.run_config(preset, cell, 1)
    assert (run.batch_size, run.learning_rate, run.noise_multiplier) == (512, 1e-2, 0.0)


# ---- the script on the tiny T5 generator -----------------------------------------------------


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    """scripts/audit_power.py --quick, black-box cells only, at test size (run once)."""
    out = tmp_path_factory.mktemp("audit_power_blackbox")
    saved = dict(querygen_audit_power.BLACKBOX["tiny_t5"])
    querygen_audit_power.BLACKBOX["tiny_t5"].update(num_private=100, epochs=3.0, learning_rate=3e-2)
    try:
        spec = importlib.util.spec_from_file_location("audit_power_script_bb", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        args = ["--out", str(out), "--quick", "--skip-whitebox", "--canaries", str(CANARIES)]
        args += ["--seed", str(SEED)]
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert module.main(args) == 0
        lines = buffer.getvalue().strip().splitlines()
        yield module.main, args, out, lines
    finally:
        querygen_audit_power.BLACKBOX["tiny_t5"].clear()
        querygen_audit_power.BLACKBOX["tiny_t5"].update(saved)


@pytest.mark.slow
def test_planted_leak_and_dp_claim(script_run):
    _, _, out, lines = script_run
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    nonprivate, dp8, cap = map(float, match.groups())
    # No noise, 3 epochs at a high learning rate: the new-token canaries are memorised.
    assert nonprivate >= 1.0, lines
    assert 0 <= dp8 <= 8.0
    results = [
        blackbox.BlackboxResult.from_dict(json.loads(p.read_text()))
        for p in sorted(out.glob("blackbox_*.json"))
    ]
    assert {r.target_epsilon for r in results} == {math.inf, 8.0}
    for r in results:
        assert r.num_in + r.num_out == CANARIES
        assert r.cap_one_run == pytest.approx(cap, abs=0.2)
        if math.isfinite(r.claimed_epsilon):
            assert r.claimed_epsilon == pytest.approx(8.0, abs=0.05)
            assert r.noise_multiplier > 0
            assert not r.violation
            s = r.primary
            assert max(s.epsilon_one_run, s.epsilon_one_run_fdp) <= r.claimed_epsilon
        else:
            assert r.noise_multiplier == 0 and r.primary.auroc > 0.8


@pytest.mark.slow
def test_coins_never_reach_an_output_file(script_run, monkeypatch):
    main, args, out, lines = script_run
    coins = [  # the script's cell k uses the audit seed SEED + 1000 + k
        draw_coins(streams(SEED + 1000 + k)[1], CANARIES) for k in range(2)
    ]
    files = list(out.rglob("*"))
    assert {p.name for p in files} == {
        f"blackbox_tiny_t5_new_m{CANARIES}_epsinf.json",
        f"blackbox_tiny_t5_new_m{CANARIES}_eps8.json",
        "blackbox_table.md",
        "roc.png",
        "histograms.png",
        "power_audit.json",
    }
    check_no_coins(files, coins, "blackbox_", blackbox.BlackboxResult)
    # Resumable by cell: a second run reads both cells back and trains nothing.
    monkeypatch.setattr(blackbox, "audit_querygen", lambda *a, **k: pytest.fail("recomputed"))
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    assert buffer.getvalue().strip().splitlines()[-1] == lines[-1]
    # A file made with other settings is refused, not reused; a bad batch before any work.
    with pytest.raises(ValueError, match="learning_rate: file 0.03 != asked 0.1"):
        querygen_audit_power.run_blackbox_cells(
            out, "tiny_t5", [math.inf], num_canaries=CANARIES, learning_rate=0.1
        )
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        querygen_audit_power.run_blackbox_cells(
            out, "tiny_t5", [math.inf], num_canaries=CANARIES, batch_size=101
        )
