"""Batched KV-cache decoding and the `synthgen lm generate` command."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from dpsynth.cli.synthgen import app, run
from synthgen.models.decoding import bucket, generate
from synthgen.models.llama import Llama
from synthgen.models.llama_loading import load_llama
from synthgen.models.sampling import SamplingConfig

FIXTURE = Path(__file__).parents[2] / "fixtures" / "llama_tiny"
GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def model():
    config, params, _ = load_llama(FIXTURE)
    return config, params


def _prompts(config, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, config.vocab_size, size=n).tolist() for n in lengths]


def _generate(model, prompts, n, sampling=GREEDY, key=None, eos_id=-1):
    config, params = model
    return generate(
        config,
        params,
        prompts,
        max_new_tokens=n,
        sampling=sampling,
        key=key,
        eos_id=eos_id,
        pad_id=0,
    )


def _full_logits(model, ids, length=32):
    """Logits of the full forward (no cache) at the real positions of `ids`."""
    config, params = model
    padded = np.zeros((1, length), np.int32)
    padded[0, : len(ids)] = ids
    mask = (np.arange(length) < len(ids)).astype(np.int32)[None]
    logits = _apply(config)({"params": params}, padded, mask)
    return np.asarray(logits[0, : len(ids)])


@functools.cache
def _apply(config):
    return jax.jit(Llama(config).apply)


def test_bucket():
    assert [bucket(n, 16) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert [bucket(n) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]


def test_greedy_matches_naive_loop_and_is_batch_invariant(model):
    prompts = _prompts(model[0], [2, 5, 11, 17])
    batch = _generate(model, prompts, 8)
    assert batch == _generate(model, prompts, 8)  # deterministic
    assert [len(o) for o in batch] == [8] * 4
    for prompt, out in zip(prompts, batch):
        assert _generate(model, [prompt], 8) == [out]
    ids = list(prompts[1])
    for _ in range(8):  # greedy without a cache: argmax of the full forward
        ids.append(int(np.argmax(_full_logits(model, ids)[-1])))
    assert batch[1] == ids[len(prompts[1]) :]


def test_a_short_last_batch_runs_the_full_batches_program(model):
    """`min_rows` pads a short batch to the full batches' rows: one compile for both, and
    the real rows' greedy continuations are those of an unpadded call."""
    from synthgen.models.decoding import _generate_padded

    prompts = _prompts(model[0], [5, 9, 12, 7, 6, 11, 10, 8, 13, 4])
    config, params = model
    run = functools.partial(
        generate, config, params, max_new_tokens=4, sampling=GREEDY, key=None, eos_id=-1,
        pad_id=0,
    )  # fmt: skip
    _generate_padded.clear_cache()  # the count below starts from none
    before = _generate_padded._cache_size()
    full = run(prompts[:9], min_rows=9)
    assert _generate_padded._cache_size() == before + 1
    last = run(prompts[9:], min_rows=9)  # 1 prompt, 16 rows as the full batch
    assert _generate_padded._cache_size() == before + 1
    assert [*full, *last] == run(prompts) and len(last) == 1
    assert run(prompts[9:]) == last and _generate_padded._cache_size() == before + 2


def test_rows_stop_at_eos(model):
    prompts = _prompts(model[0], [4, 9], seed=1)
    free = _generate(model, prompts, 10)
    row = free[0]
    j = next(j for j in range(1, 10) if row[j] not in row[:j])
    stopped = _generate(model, prompts, 10, eos_id=row[j])
    assert stopped[0] == row[:j]
    other = free[1]
    cut = other.index(row[j]) if row[j] in other else len(other)
    assert stopped[1] == other[:cut]


def test_top_k_sampling_only_emits_top_k_tokens(model):
    prompt = _prompts(model[0], [6], seed=2)[0]
    sampling = SamplingConfig(temperature=1.5, top_k=3)
    outs = _generate(model, [prompt] * 8, 6, sampling=sampling, key=jax.random.key(0))
    assert len({tuple(o) for o in outs}) > 1  # it does sample
    for out in outs:
        logits = _full_logits(model, prompt + out)
        for t, token in enumerate(out):
            top3 = np.argsort(logits[len(prompt) - 1 + t])[-3:]
            assert token in top3
    again = _generate(model, [prompt] * 8, 6, sampling=sampling, key=jax.random.key(0))
    assert again == outs
    other = _generate(model, [prompt] * 8, 6, sampling=sampling, key=jax.random.key(1))
    assert other != outs


def test_generate_validates_inputs(model):
    config = model[0]
    with pytest.raises(ValueError, match="at least one token"):
        _generate(model, [[5], []], 4)
    with pytest.raises(ValueError, match="exceed the context"):
        _generate(model, [[5] * config.max_seq_len], 4)
    with pytest.raises(ValueError, match="PRNG key"):
        _generate(model, [[5]], 4, sampling=SamplingConfig(temperature=1.0))


def test_cli_error_is_one_line(capsys):
    code = run(app, ["lm", "generate", "--model", str(FIXTURE / "model.gguf"), "--prompt", "x"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "no tokenizer" in err


@pytest.mark.slow
def test_smollm2_chat_answers_paris(capsys):
    argv = ["lm", "generate", "--model", "smollm2-135m-instruct"]
    argv += ["--chat", "What is the capital of France?", "--max-new-tokens", "32"]
    assert run(app, argv) == 0
    assert "Paris" in capsys.readouterr().out
