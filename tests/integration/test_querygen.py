"""End to end: DP fine-tuning of tiny T5 and Llama generators on real wiki pairs, then
synthetic queries with their privacy metadata."""

import json

import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpsynth.config_files import querygen_preset
from synthgen import corpora, querygen
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.privacy.receipts import ledger_payer
from synthgen.shards import Shard
from synthgen.work_folder import run_payer

N_TRAIN = 300


@pytest.fixture(scope="module")
def wiki():
    ds = corpora.load_wiki_summaries(limit=N_TRAIN + 12)
    return ds.select(range(N_TRAIN)), ds.select(range(N_TRAIN, N_TRAIN + 12))


def _dp_accounting_epsilon(privacy):
    """The same (q, sigma, steps, delta) through dp-accounting directly."""
    acc = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    step = dp_event.PoissonSampledDpEvent(
        privacy["sampling_rate"], dp_event.GaussianDpEvent(privacy["noise_multiplier"])
    )
    acc.compose(dp_event.SelfComposedDpEvent(step, privacy["steps"]))
    return acc.get_epsilon(privacy["delta"])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny_t5", "tiny_llama"])
def test_train_then_generate(preset, wiki, tmp_path):
    train, held_out = wiki
    config = querygen_preset(preset).replace(dp_seed=0, queries_per_doc=2, generation_batch=4)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "wiki", 8.0, 1 / (2 * N_TRAIN)))
    result = querygen.train_generator(
        config,
        train,
        tmp_path / "gen",
        pay=run_payer(ledger, ("t", "wiki"), out_dir=tmp_path / "gen"),
        progress=False,
    )
    assert result.steps_run == result.plan.steps
    assert result.plan.epsilon <= 8.0
    assert sum(result.losses[-5:]) < sum(result.losses[:5])  # the loss falls

    out = tmp_path / "synthetic"
    ds = querygen.generate_queries(tmp_path / "gen", held_out, out, seed=1)
    # Three shards (one generation batch of 4 documents each), merged: the same bytes.
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, folder in enumerate(shards):
        querygen.generate_queries(
            tmp_path / "gen", held_out, folder, seed=1, shard=Shard(i, 3), progress=False
        )
    querygen.merge_query_shards(shards[::-1], tmp_path / "merged")
    for name in ("queries.jsonl", "queries.parquet"):
        assert (tmp_path / "merged" / name).read_bytes() == (out / name).read_bytes()
    assert ds.column_names == ["doc_id", "document", "query"]
    assert len(ds) == 2 * len(held_out)
    assert set(ds["doc_id"]) == set(held_out["doc_id"])
    assert (out / "queries.jsonl").is_file() and (out / "queries.parquet").is_file()
    meta = json.loads((out / "metadata.json").read_text())
    privacy = meta["privacy"]
    assert privacy["delta"] == 1 / (2 * N_TRAIN)
    assert privacy["sampling_rate"] == config.dp.batch_size / N_TRAIN
    assert privacy["epsilon"] == pytest.approx(_dp_accounting_epsilon(privacy), rel=1e-9)
    assert privacy["accountant"] == "pld" and privacy["sampling"] == "poisson"
    assert privacy["clip_norm"] == config.dp.clip_norm
    assert "no" in meta["post_processing"] or "spends no" in meta["post_processing"]
    assert meta["model"]["family"] == config.family
    # The whole run was charged once, before training.
    [charge] = ledger.charges("t", "wiki")
    assert charge.epsilon == pytest.approx(privacy["epsilon"])


def test_bad_input_fails_before_compute(wiki, tmp_path):
    train, _ = wiki
    config = querygen_preset("tiny_t5")
    with pytest.raises(ValueError, match="empty"):
        querygen.train_generator(config, train.select([]), tmp_path)
    with pytest.raises(ValueError, match="lacks field"):
        querygen.train_generator(config, train.remove_columns("query"), tmp_path)
    with pytest.raises(ValueError, match="delta"):
        querygen.train_generator(config.replace(dp_delta=0.5), train, tmp_path)
    with pytest.raises(ValueError, match="target_epsilon"):
        config.replace(dp_target_epsilon=0.0)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    bare = ledger_payer(ledger, ("t", "wiki"), stage="dp-train")  # no work folder: no resume
    with pytest.raises(ValueError, match="run payer"):
        querygen.train_generator(config, train, tmp_path / "gen", pay=bare)
    other = run_payer(ledger, ("t", "wiki"), out_dir=tmp_path / "gen")
    with pytest.raises(ValueError, match="not the payer's work folder"):
        querygen.train_generator(
            config, train, tmp_path / "gen", pay=other, work_dir=tmp_path / "w"
        )
    assert not (tmp_path / "checkpoints").exists() and ledger.charges("t", "wiki") == []


def _lora_leaves(params):
    from synthgen.models.lora import is_lora_path

    flat = jax.tree_util.tree_leaves_with_path(params)
    return {
        tuple(p.key for p in path): np.asarray(x)
        for path, x in flat
        if is_lora_path([p.key for p in path])
    }


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny_t5", "tiny_llama"])
def test_lora_fine_tuning_moves_only_the_adapters(preset, wiki, tmp_path):
    train, held_out = wiki
    config = querygen_preset(preset).replace(
        lora_rank=4, dp_seed=0, dp_epochs=1, dp_target_epsilon=None, dp_noise_multiplier=0.8
    )
    family, base = querygen.load_base(config, tokenizer_dir=tmp_path / "tok", seed=0)
    result = querygen.train_generator(
        config, train, tmp_path / "gen", work_dir=tmp_path / "work", progress=False
    )
    adapters = _lora_leaves(result.trainable)
    assert adapters and all("lora" in k[-1] for k in adapters)
    assert any(np.abs(v).max() > 0 for k, v in adapters.items() if k[-1] == "lora_b")
    _, params, record = querygen.load_generator(tmp_path / "gen")
    # The frozen base is exactly the initial one; only adapters moved.
    _, frozen_before = querygen.split_trainable(base, lora=True)
    _, frozen_after = querygen.split_trainable(params, lora=True)
    for a, b in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(frozen_after), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert record["lora_rank"] == 4
    ds = querygen.generate_queries(tmp_path / "gen", held_out.select(range(2)), tmp_path / "q")
    assert len(ds) == 2


@pytest.mark.slow
def test_smollm2_lora_saves_adapters_and_reloads_from_the_asset(wiki, tmp_path):
    train, held_out = wiki
    config = querygen_preset("smollm2_lora_cpu").replace(
        input_len=48,
        target_len=8,
        max_new_tokens=6,
        generation_batch=2,
        dp_batch_size=4,
        dp_epochs=4 / 100,  # one step of an expected 4 examples
        dp_physical_batch=4,
        dp_microbatch=2,
        dp_seed=0,
    )
    result = querygen.train_generator(
        config, train.select(range(100)), tmp_path / "gen", work_dir=tmp_path / "w", progress=False
    )
    assert result.steps_run == 1
    stored = (tmp_path / "gen" / querygen.PARAMS_FILE).stat().st_size
    assert stored < 5_000_000  # adapters only, not the 135M-parameter base
    family, params, _ = querygen.load_generator(tmp_path / "gen")
    assert _lora_leaves(params) and family.tokenizer.eos_id is not None
    ds = querygen.generate_queries(
        tmp_path / "gen", held_out.select(range(2)), tmp_path / "q", seed=0
    )
    assert len(ds) == 2 and all(isinstance(q, str) for q in ds["query"])
