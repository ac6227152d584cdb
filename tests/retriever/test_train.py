"""Dual-encoder training: the in-batch loss by hand, training, resumption, the DP baseline."""

import json
import math
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retriever import evaluate as ev
from retriever.encoders import load_encoder, random_encoder
from retriever.train import (
    RetrieverConfig,
    in_batch_softmax_loss,
    train_retriever,
    train_retriever_dp,
)
from synthgen import corpora, dp_train
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.work_folder import run_payer

sys.path.insert(0, str(Path(__file__).parents[1] / "synthgen"))
from release_audit import assert_clean_release, files_containing, needles, record_randomness  # noqa: E402, I001


@pytest.fixture(scope="module")
def wiki():
    return corpora.load_wiki_summaries(limit=96)


@pytest.fixture(scope="module")
def encoder(wiki):
    return random_encoder("bert", seed=0, vocab_texts=list(wiki["document"]) + list(wiki["query"]))


def test_in_batch_loss_by_hand():
    q = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    d = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    s = 2.0
    logits = s * np.asarray(q @ d.T)
    want = -np.mean([logits[i, i] - np.log(np.exp(logits[i]).sum()) for i in range(3)])
    got = in_batch_softmax_loss(q, d, jnp.array([0, 1, 2]), jnp.float32(s))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # Rows 0 and 2 share a document: neither is the other's negative.
    got = in_batch_softmax_loss(q, d, jnp.array([5, 1, 5]), jnp.float32(s))
    keep = [[0, 1], [0, 1, 2], [1, 2]]
    want = -np.mean([logits[i, i] - np.log(np.exp(logits[i, keep[i]]).sum()) for i in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_training_lowers_the_loss_and_resumes_to_the_same_model(wiki, encoder, tmp_path):
    config = RetrieverConfig(
        batch_size=8,
        epochs=3,
        learning_rate=1e-3,
        max_query_len=16,
        max_doc_len=32,
        checkpoint_every=5,
    )
    args = (encoder, wiki["query"], wiki["document"], config)
    full = train_retriever(*args, doc_ids=wiki["doc_id"], out_dir=tmp_path / "a", progress=False)
    assert full.steps_run == full.total_steps == 36
    assert np.mean(full.losses[-6:]) < np.mean(full.losses[:6])
    part = train_retriever(
        *args, doc_ids=wiki["doc_id"], out_dir=tmp_path / "b", progress=False, stop_after=17
    )
    assert part.steps_run == 17 and not (tmp_path / "b" / "encoder.json").exists()
    resumed = train_retriever(*args, doc_ids=wiki["doc_id"], out_dir=tmp_path / "b", progress=False)
    assert resumed.steps_run == 36
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The saved model loads and embeds like the trained parameters.
    loaded = load_encoder(str(tmp_path / "a"))
    texts = list(wiki["query"][:5])
    np.testing.assert_allclose(
        loaded.encode(texts, max_len=16),
        encoder.encode(texts, params=full.params["query"], max_len=16),
        atol=1e-5,
    )


def test_separate_towers_are_saved_and_used(wiki, encoder, tmp_path):
    config = RetrieverConfig(
        batch_size=8,
        epochs=1,
        learning_rate=1e-3,
        max_query_len=16,
        max_doc_len=32,
        separate_towers=True,
    )
    n = 92  # 11 batches of 8 and 4 pairs that fill none
    result = train_retriever(
        encoder,
        list(wiki["query"])[:n],
        list(wiki["document"])[:n],
        config,
        out_dir=tmp_path,
        progress=False,
    )
    assert set(result.params) == {"query", "doc", "log_scale"}
    assert result.steps_run == 11
    assert result.pairs_left_out_per_epoch == 4  # said, not dropped silently
    query_enc, doc_enc = ev.load_towers(str(tmp_path))
    assert query_enc is not doc_enc
    text = [wiki["document"][0]]
    np.testing.assert_allclose(
        doc_enc.encode(text, max_len=32),
        encoder.encode(text, params=result.params["doc"], max_len=32),
        atol=1e-5,
    )


def test_evaluate_exact_and_scann_agree(wiki, encoder):
    rows = [{"query": q, "doc_id": d} for q, d in zip(wiki["query"], wiki["doc_id"])][:40]
    kwargs = dict(max_query_len=16, max_doc_len=32, progress=False)
    exact = ev.evaluate(
        encoder, list(wiki["doc_id"]), list(wiki["document"]), rows, index="exact", **kwargs
    )
    scann = ev.evaluate(
        encoder, list(wiki["doc_id"]), list(wiki["document"]), rows, index="scann-bf", **kwargs
    )
    for name in ("ndcg@10", "recall@10", "mrr@10"):
        assert 0 <= exact[name] <= 1
        assert exact[name] == pytest.approx(scann[name], abs=1e-6)
    assert exact["num_queries"] == 40 and exact["index"] == "exact"
    with pytest.raises(ValueError, match="not in the corpus"):
        ev.evaluate(encoder, ["x"], ["text"], rows[:1], **kwargs)


def test_direct_dp_baseline_charges_and_records_its_guarantee(wiki, encoder, tmp_path, monkeypatch):
    n = len(wiki)
    dp_config = dp_train.DPConfig(
        batch_size=16,
        epochs=1,
        clip_norm=1.0,
        learning_rate=1e-3,
        target_epsilon=4.0,
        physical_batch=8,
        microbatch=4,
        seed=2**90 + 5,
    )
    plan = dp_train.plan_privacy(dp_config, n)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "wiki", 4.0, plan.delta, relation=plan.relation))
    config = RetrieverConfig(max_query_len=16, max_doc_len=32)
    seen = record_randomness(monkeypatch)
    release, work = tmp_path / "m", tmp_path / "private" / "work"

    def run(**kw):
        return train_retriever_dp(
            encoder, wiki["query"], list(range(n)), wiki["document"], config, dp_config,
            out_dir=release, pay=run_payer(ledger, ("t", "wiki"), out_dir=release, work_dir=work),
            progress=False, **kw,
        )  # fmt: skip

    with pytest.raises(ValueError, match="must not overlap"):  # the noise key would ship
        train_retriever_dp(encoder, wiki["query"], list(range(n)), wiki["document"], config,
                           dp_config, out_dir=release, work_dir=release / "w")  # fmt: skip
    part = run(stop_after=2)
    assert part.steps_run == 2 and not (release / "encoder.json").exists()
    assert files_containing(work, needles(seen))  # the secrets are in the work folder only
    result = run()  # resumes: the scope's cap is this run's epsilon, so no second charge
    assert result.resumed_from == 2 and result.steps_run == plan.steps
    assert not work.exists()
    [charge] = ledger.charges("t", "wiki")
    assert charge.epsilon == pytest.approx(plan.epsilon) and plan.epsilon <= 4.0
    assert_clean_release(release, seen)
    meta = json.loads((release / "encoder.json").read_text())
    assert meta["privacy"]["epsilon"] == pytest.approx(plan.epsilon)
    assert math.isclose(meta["privacy"]["delta"], 1 / (2 * n))
    assert "seconds" not in meta["training"] and "seconds" not in json.dumps(meta)
    assert meta["training"]["config"]["dp"]["batch_size"] == 16  # what ran, and never a seed
    assert (
        "seed" not in json.dumps(meta["training"])
        and "batch_size" not in meta["training"]["config"]
    )
    # The release alone is the model: evaluate it from a copy. The document tower is the
    # frozen public encoder; only the query tower moved.
    shipped = tmp_path / "shipped"
    shutil.copytree(release, shipped)
    shutil.rmtree(release)
    query_enc, doc_enc = ev.load_towers(str(shipped))
    text = [wiki["document"][0]]
    np.testing.assert_allclose(
        doc_enc.encode(text, max_len=32), encoder.encode(text, max_len=32), atol=1e-6
    )
    assert not np.allclose(query_enc.encode(text, max_len=32), encoder.encode(text, max_len=32))
