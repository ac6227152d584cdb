"""`NextTokenLM.append` with one token per row: each row continues on its own, exactly as
a session of that row alone would (the answer-vote voters' greedy decoding)."""

import types
from pathlib import Path

import numpy as np
import pytest

from synthgen.lm_backends import FlaxLM, TinyLM, row_tokens

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
