"""Private Evolution (`synthgen.evolution`): the plan, the loop with the fixture LM, the
ledger charge before the first histogram, public-only prompts, the released folder, the CLI."""

import json
import subprocess
import sys

import numpy as np
import pytest

from synthgen import evolution
from synthgen.evolution import generation
from synthgen.lm_backends import TinyLM
from synthgen.privacy import accounting
from synthgen.privacy.errors import BudgetExceededError
from synthgen.privacy.ledger import PrivacyLedger, Scope
from synthgen.privacy.nn_histogram import nn_histogram_event

PRIVATE = ["the cat sat on the mat", "a cat and a kitten", "cats purr"] * 20 + [
    "dogs bark loudly",
    "a dog fetched the ball",
] * 20
PRIVATE_LABELS = ["cat"] * 60 + ["dog"] * 40


def embed(texts):
    """Bag of letters, unit norm: a public, deterministic encoder for tests."""
    out = np.zeros((len(texts), 26), np.float32)
    for i, text in enumerate(texts):
        for ch in text.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1, norms)


def _config(**overrides):
    values = dict(
        num_samples=4, iterations=2, noise_multiplier=2.0, public_size=100,
        labels=("cat", "dog"), initial_prompt="{label}: ", variation_prompt="{label} {text}",
        max_new_tokens=6, batch_size=4,
    )  # fmt: skip
    values.update(overrides)
    return evolution.EvolutionConfig(**values)


class ScriptedSampler:
    """Initial prompts get candidates from a fixed public list; a variation returns its
    {text} unchanged. Records every prompt it sees."""

    batch_size = 8

    def __init__(self, candidates):
        self.candidates, self.prompts = list(candidates), []

    def sample(self, prompts, seed):
        self.prompts += list(prompts)
        out = []
        for p in prompts:
            if p.endswith(": "):
                out.append(self.candidates.pop(0))
            else:
                out.append(p.split(" ", 1)[1])
        return out


def test_plan_is_t_gaussians_with_the_declared_delta():
    plan = evolution.plan_evolution(_config(target_epsilon=4.0, noise_multiplier=None))
    assert plan.delta == pytest.approx(1 / 1000)  # 1 / (10 N), N declared
    assert plan.epsilon <= 4.0
    assert plan.event == nn_histogram_event(plan.noise_multiplier, 2)
    assert accounting.epsilon(plan.event, plan.delta) == pytest.approx(plan.epsilon)
    votes = evolution.plan_evolution(_config(votes=4))
    assert votes.noise_std == pytest.approx(4.0) and votes.threshold_count == pytest.approx(8.0)
    with pytest.raises(ValueError, match="delta"):
        evolution.plan_evolution(_config(delta=0.02))  # >= 1 / N
    with pytest.raises(ValueError, match="exactly one"):
        _config(target_epsilon=1.0)
    with pytest.raises(ValueError, match="text"):
        _config(variation_prompt="no slot")


def test_end_to_end_with_the_tiny_lm_is_charged_and_labelled(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1e-3))
    config = _config(population=3)
    sampler = evolution.make_sampler(TinyLM(), max_new_tokens=6, batch_size=4)
    seen = []

    def spy(prompts, seed):
        seen.extend(prompts)
        return evolution.NextTokenSampler.sample(sampler, prompts, seed)

    sampler.sample = spy
    events = []
    result = evolution.evolve(
        sampler, embed, PRIVATE, config, rng=np.random.default_rng(0),
        private_labels=PRIVATE_LABELS, ledger=ledger, ledger_scope=("t", "d"),
        progress=lambda *a: events.append(a),
    )  # fmt: skip
    assert result.labels == ["cat", "cat", "dog", "dog"] and len(result.texts) == 4
    # 6 initial samples (3 per label) + one round of variations (keep_share 0.25 of 3 -> 0)
    assert result.samples_generated == 12 and len(seen) == 12
    assert not any(p in prompt for prompt in seen for p in set(PRIVATE))  # public prompts only
    charges = ledger.charges("t", "d")
    assert len(charges) == 1 and charges[0].epsilon == pytest.approx(result.plan.epsilon)
    assert charges[0].relation == "ADD_OR_REMOVE_ONE"
    assert {e[0] for e in events} == {"initial", "histogram", "variation"}
    assert all(isinstance(x, int) for e in events for x in e[1:])  # public counts only
    meta = evolution.write_output(tmp_path / "out", result, config, model="tiny", encoder="test",
                                  seeded=True, ledger_scope=("t", "d"))  # fmt: skip
    rows = [json.loads(x) for x in (tmp_path / "out" / "synthetic.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == result.labels
    assert (tmp_path / "out" / "synthetic.parquet").is_file()
    assert meta["privacy"]["epsilon"] == result.plan.epsilon
    assert meta["randomness"]["seeded"] is True
    text = (tmp_path / "out" / "metadata.json").read_text()
    assert "second" not in text and "cat sat" not in text  # no timings, no private text


def test_the_ledger_is_charged_before_the_first_histogram(tmp_path, monkeypatch):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1e-3))
    seen = []
    real = generation.dp_nn_histogram

    def histogram(counts, **kwargs):
        seen.append(len(ledger.charges("t", "d")))
        return real(counts, **kwargs)

    monkeypatch.setattr(generation, "dp_nn_histogram", histogram)
    sampler = ScriptedSampler(["cat", "mat", "dog", "log"])
    evolution.evolve(
        sampler, embed, PRIVATE, _config(), rng=np.random.default_rng(1),
        private_labels=PRIVATE_LABELS, ledger=ledger, ledger_scope=("t", "d"),
    )  # fmt: skip
    assert seen == [1, 1]  # two histograms, both after the one charge


def test_an_over_budget_run_is_refused_before_any_work(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 0.5, 1e-3))
    sampler = ScriptedSampler(["cat", "mat", "dog", "log"])
    calls = []
    with pytest.raises(BudgetExceededError):
        evolution.evolve(sampler, lambda t: calls.append(t) or embed(t), PRIVATE, _config(),
                         rng=np.random.default_rng(0), private_labels=PRIVATE_LABELS,
                         ledger=ledger, ledger_scope=("t", "d"))  # fmt: skip
    assert ledger.charges("t", "d") == [] and sampler.prompts == [] and calls == []


def test_selection_follows_the_private_votes():
    # Low noise: every private "cat" sample is nearest to "cat sat mat", so the release
    # converges to it; rows with a label outside the public list are ignored.
    sampler = ScriptedSampler(["zzz qqq", "cat sat on mat", "xyz", "dogs bark"])
    config = _config(num_samples=4, iterations=3, noise_multiplier=0.5, population=2,
                     threshold=1.0)  # fmt: skip
    result = evolution.evolve(
        sampler, embed, PRIVATE + ["zzz qqq zzz"] * 50, config, rng=np.random.default_rng(2),
        private_labels=PRIVATE_LABELS + ["other"] * 50,
    )  # fmt: skip
    assert result.texts == ["cat sat on mat"] * 2 + ["dogs bark"] * 2
    assert result.selected_share[0] == pytest.approx(0.5)


def test_private_labels_are_required_and_checked():
    sampler = ScriptedSampler(["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="private_labels"):
        evolution.evolve(sampler, embed, PRIVATE, _config(), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="one label"):
        evolution.evolve(sampler, embed, PRIVATE, _config(), rng=np.random.default_rng(0),
                         private_labels=["cat"])  # fmt: skip


def test_the_sampler_keeps_top_p_mass_and_greedy_is_argmax():
    sampler = evolution.NextTokenSampler(TinyLM(), max_new_tokens=1, top_p=0.5)
    logprobs = np.log(np.array([[0.6, 0.3, 0.1]] * 2000))
    picks = sampler._pick(logprobs, np.random.default_rng(0))
    assert set(picks.tolist()) == {0}  # 0.6 alone reaches p = 0.5
    sampler.top_p = 0.85  # keeps 0 and 1 (mass before 1 is 0.6 < 0.85, before 2 is 0.9)
    counts = np.bincount(sampler._pick(logprobs, np.random.default_rng(0)), minlength=3)
    assert counts[0] / counts[:2].sum() == pytest.approx(2 / 3, abs=0.03) and counts[2] == 0
    sampler.temperature = 0.0
    assert sampler._pick(logprobs[:3], np.random.default_rng(0)).tolist() == [0, 0, 0]


def test_cli_writes_the_release_and_refuses_bad_options(tmp_path):
    private = tmp_path / "private.jsonl"
    private.write_text(
        "".join(json.dumps({"text": t, "topic": y}) + "\n" for t, y in
                zip(PRIVATE, PRIVATE_LABELS, strict=True))
    )  # fmt: skip
    base = [sys.executable, "-m", "synthgen.cli", "generate-docs-pe", "--private", str(private),
            "--text-field", "text", "--out", str(tmp_path / "out"), "--model", "tiny",
            "--encoder", "random:bert", "--ledger", str(tmp_path / "ledger.sqlite")]  # fmt: skip
    bad = subprocess.run(base + ["--num-samples", "2", "--epsilon", "4", "--label-field",
                                 "topic"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode != 0 and "--labels" in bad.stderr and "Traceback" not in bad.stderr
    run = subprocess.run(
        base + ["--num-samples", "4", "--epsilon", "4", "--iterations", "2", "--label-field",
                "topic", "--labels", "cat,dog", "--public-size", "100", "--max-new-tokens", "4",
                "--seed", "0"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["num_examples"] == 4 and summary["epsilon"] <= 4.0
    assert "samples/s" in run.stderr and "warning: --seed" in run.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["privacy"]["delta"] == pytest.approx(1e-3)
    assert meta["generation"]["config"]["labels"] == ["cat", "dog"]
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    assert [c.stage for c in ledger.charges("default", "private")] == ["evolution"]


def test_flax_sampler_batches_prompts_and_is_reproducible_by_seed():
    import jax

    from synthgen.lm_backends import FlaxLM
    from synthgen.models.llama import Llama, LlamaConfig

    class Tok:  # a character tokenizer: ids 3.. are bytes
        vocab_size, eos_id, pad_id, bos_id, add_bos = 260, 1, 0, 2, True
        chat_template = None

        def encode(self, text):
            return [3 + b for b in text.encode()]

        def decode(self, ids):
            return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")

    cfg = LlamaConfig.tiny()
    cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": 260})
    params = Llama(cfg).init(jax.random.key(0), np.zeros((1, 4), np.int32))["params"]
    lm = FlaxLM(cfg, params, Tok())
    sampler = evolution.make_sampler(lm, max_new_tokens=5, batch_size=4, temperature=1.0)
    assert isinstance(sampler, evolution.FlaxSampler) and not sampler.chat
    prompts = [f"topic {i}: " for i in range(6)]  # two batches (4 + 2)
    first, again = sampler.sample(prompts, 7), sampler.sample(prompts, 7)
    assert len(first) == 6 and first == again
    assert sampler.sample(prompts, 8) != first
