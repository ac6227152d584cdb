"""Hard-negative mining (the false-negative cut, the public-encoder check) and training with
hard negatives (the loss by hand, a masked own document, a run that learns)."""

import jax.numpy as jnp
import numpy as np
import pytest

from retriever.encoders import random_encoder
from retriever.negatives import NegativeMining, mine_hard_negatives, pick_negatives
from retriever.train import RetrieverConfig, in_batch_softmax_loss, train_retriever
from synthgen import corpora


def test_pick_negatives_skips_near_positives_and_takes_the_best_of_the_rest():
    scores = np.array(
        [
            [0.90, 0.89, 0.50, 0.70, 0.10],  # own 0: doc 1 is within 95% (a likely false
            [0.20, 0.80, 0.79, 0.10, 0.00],  # negative), so 3; own 1: 2 too close, so 0
            [0.33, 0.335, 0.34, 0.50, 0.34],  # own 4: every other scores above 95% of it
        ]
    )
    got = pick_negatives(scores, np.array([0, 1, 4]), max_relative_score=0.95, depth=4)
    assert got.tolist() == [3, 0, -1]
    # depth 1 looks at the single best other document only
    assert pick_negatives(
        scores, np.array([0, 1, 4]), max_relative_score=0.95, depth=1
    ).tolist() == [
        -1,
        -1,
        -1,
    ]
    # 1.0 keeps anything below the positive
    assert pick_negatives(scores[:1], np.array([0]), max_relative_score=1.0, depth=4).tolist() == [
        1
    ]


def test_a_positive_with_a_negative_score_never_lets_a_higher_document_through():
    scores = np.array([[-0.20, -0.195, -0.5, -0.3]])  # own 0; doc 1 outranks it
    for share in (0.95, 1.0):
        got = pick_negatives(scores, np.array([0]), max_relative_score=share, depth=3)
        assert got.tolist() == [3]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_relative_score"):
        NegativeMining(max_relative_score=0.0)
    with pytest.raises(ValueError, match="depth"):
        NegativeMining(depth=0)


def test_the_loss_with_hard_negatives_by_hand_and_an_own_document_masked():
    q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    d = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    n = jnp.array([[0.6, 0.8], [0.8, 0.6]])
    s = 3.0
    logits = s * np.asarray(q @ jnp.concatenate([d, n]).T)
    want = -np.mean([logits[i, i] - np.log(np.exp(logits[i]).sum()) for i in range(2)])
    got = in_batch_softmax_loss(q, d, jnp.array([0, 1]), jnp.float32(s), n, jnp.array([2, 3]))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # Row 1's "negative" is row 0's own document (key 0): masked for row 0 only.
    got = in_batch_softmax_loss(q, d, jnp.array([0, 1]), jnp.float32(s), n, jnp.array([2, 0]))
    keep = [[0, 1, 2], [0, 1, 2, 3]]
    want = -np.mean([logits[i, i] - np.log(np.exp(logits[i, keep[i]]).sum()) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # Row 0 has no hard negative (key -1): its column is out of every query's softmax.
    got = in_batch_softmax_loss(q, d, jnp.array([0, 1]), jnp.float32(s), n, jnp.array([-1, 3]))
    keep = [[0, 1, 3], [0, 1, 3]]
    want = -np.mean([logits[i, i] - np.log(np.exp(logits[i, keep[i]]).sum()) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.fixture(scope="module")
def wiki():
    return corpora.load_wiki_summaries(limit=64)


def test_mined_negatives_are_never_the_own_document_and_training_uses_them(wiki, tmp_path):
    ids, docs, queries = list(wiki["doc_id"]), list(wiki["document"]), list(wiki["query"])
    config = NegativeMining(encoder="random:bert", max_query_len=16, max_doc_len=32)
    negatives, record = mine_hard_negatives(queries, ids, ids, docs, config)
    assert len(negatives) == len(ids) and all(n != own for n, own in zip(negatives, ids))
    assert record["queries"] == 64 and record["without_negative"] == sum(
        n is None for n in negatives
    )
    assert "no privacy budget" in record["statement"]
    text = dict(zip(ids, docs))
    encoder = random_encoder("bert", seed=0, vocab_texts=docs + queries)
    rconfig = RetrieverConfig(
        batch_size=8, epochs=2, learning_rate=1e-3, max_query_len=16, max_doc_len=32
    )
    result = train_retriever(
        encoder,
        queries,
        docs,
        rconfig,
        doc_ids=ids,
        hard_negatives=[None if n is None else text[n] for n in negatives],
        hard_negative_ids=negatives,
        progress=False,
    )
    assert result.steps_run == 16 and all(np.isfinite(result.losses))
    assert np.mean(result.losses[-4:]) < np.mean(result.losses[:4])
    with pytest.raises(ValueError, match="one hard negative"):
        train_retriever(encoder, queries, docs, rconfig, hard_negatives=docs[:3], progress=False)
    with pytest.raises(ValueError, match="hard_negative_ids too"):
        train_retriever(
            encoder, queries, docs, rconfig, doc_ids=ids, hard_negatives=docs, progress=False
        )


def test_a_trained_encoder_may_not_mine(tmp_path):
    from retriever import provenance

    folder = tmp_path / "trained"
    folder.mkdir()
    provenance.write_provenance(folder, provenance.real_data(num_pairs=5))
    with pytest.raises(ValueError, match="public pretrained"):
        mine_hard_negatives(["q"], ["a"], ["a"], ["doc"], NegativeMining(encoder=str(folder)))
