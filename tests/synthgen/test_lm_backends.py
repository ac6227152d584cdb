"""`NextTokenLM.append` with one token per row: each row continues on its own, exactly as
a session of that row alone would (the keywords voters' greedy decoding)."""

import types
from pathlib import Path

import numpy as np
import pytest

from synthgen.lm_backends import FlaxLM, TinyLM
from synthgen.next_token import row_tokens

FIXTURE = Path(__file__).parents[1] / "fixtures" / "llama_tiny" / "model.gguf"


def test_row_tokens_broadcasts_an_int_and_checks_a_list():
    assert row_tokens(7, 3) == [7, 7, 7]
    assert row_tokens(np.int64(2), 2) == [2, 2]
    assert row_tokens([1, 2], 2) == [1, 2]
    with pytest.raises(ValueError, match="one token per row"):
        row_tokens([1, 2, 3], 2)


def _tiny_flax() -> FlaxLM:
    from synthgen.models.llama_loading import load_llama

    config, params, _ = load_llama(FIXTURE)  # the fixture holds no tokenizer
    return FlaxLM(config, params, types.SimpleNamespace(pad_id=0))


@pytest.mark.parametrize("make", [TinyLM, _tiny_flax], ids=["tiny", "flax"])
def test_per_row_append_matches_one_session_per_row(make):
    lm = make()
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    steps = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    together = [lm.start(prompts, 4)]
    together += [lm.append(tokens) for tokens in steps]
    for row, prompt in enumerate(prompts):
        alone = make()
        expected = [alone.start([prompt], 4)]
        expected += [alone.append(tokens[row]) for tokens in steps]
        for got, want in zip(together, expected):
            np.testing.assert_allclose(got[row], want[0], rtol=1e-4, atol=1e-4)
    # and different tokens do give different rows (the check is not vacuous)
    assert not np.allclose(together[-1][0], together[-1][1], atol=1e-3)


def test_start_documents_matches_start_on_the_whole_prompts():
    """A session from the documents' precomputed keys (head + document, the suffix run
    after them) gives the same log-probabilities as `start` on the whole prompts, before
    and after appended tokens; rows may repeat a document and documents are cut to W."""
    lm = _tiny_flax()
    head, suffix, width = [3, 4, 5], [20, 21, 22, 23, 24], 6
    documents = [[30, 31], [32, 33, 34, 35, 36, 37, 38, 39], [40], [41, 42, 43]]
    kv = lm.document_kv(head, documents, width)
    assert kv.documents == 4 and kv.width == width and kv.lengths.tolist() == [2, 6, 1, 3]
    rows = [1, 3, 0, 1, 2]
    prompts = [head + documents[r][:width] + suffix for r in rows]
    reference = lm.fork()
    expected = [reference.start(prompts, 3)] + [reference.append(t) for t in (7, 8)]
    got = [lm.start_documents(kv, rows, suffix, 3)] + [lm.append(t) for t in (7, 8)]
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape == (len(rows), lm.vocab_size)
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
    assert not np.allclose(got[0][0], got[0][1], atol=1e-3)  # documents matter
    with pytest.raises(ValueError, match="exceed the context"):
        lm.start_documents(kv, rows, suffix * 1000, 3)


def test_rows_are_padded_to_a_power_of_two_then_a_multiple_of_eight():
    from synthgen.models.decoding import row_bucket

    got = [row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 65)]
    assert got == [1, 2, 4, 8, 8, 16, 16, 24, 40, 64, 72]
