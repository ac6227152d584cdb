"""DP-Adafactor: clipping against a naive reference, sensitivity, noise scale, resumption."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from synthgen import dp_train, run_seed
from synthgen.batching import BatchSampler
from synthgen.privacy import accounting
from synthgen.privacy.errors import BudgetExceededError
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope
from synthgen.privacy.receipts import ledger_payer
from synthgen.privacy.rng import secure_rng
from synthgen.work_folder import WorkFolder

D = 6
# The jitted clipped sum of 13 or 14 float32 gradients (leaves up to about 2) lands within 1.1e-5 of
# a float64 reference on jaxlib 0.10.2's CPU, unoptimised or not; the eager loop within 6e-7
# (both at float32 products: `float32_products`).
# Elementwise, a near-zero entry can differ by 3e-6 (rtol alone cannot hold); an unclipped
# or unmasked example moves entries by 1e-2 and more.
F32_SUM_ATOL = 2e-5


@pytest.fixture
def float32_products():
    """Products at float32 on any device (a GPU runs them as TF32 by default, `make
    test-accelerator`): the comparisons with the naive loop check the algorithm, not the
    device's rounding, which the clip bound's own tests cover (test_ghost_clipping.py)."""
    with jax.default_matmul_precision("highest"):
        yield


def _loss(trainable, frozen, ex):
    pred = jnp.tanh(ex["x"] @ trainable["w"]) @ trainable["v"] + frozen["bias"]
    return (pred - ex["y"]) ** 2


def _setup(n=64, seed=0):
    rng = np.random.default_rng(seed)
    data = {
        "x": rng.normal(size=(n, D)).astype(np.float32) * 3,
        "y": rng.normal(size=(n,)).astype(np.float32),
    }
    trainable = {
        "w": jnp.asarray(rng.normal(size=(D, 4)), jnp.float32),
        "v": jnp.asarray(rng.normal(size=(4,)), jnp.float32),
    }
    return data, trainable, {"bias": jnp.float32(0.5)}


def _naive_clipped_sum(trainable, frozen, data, mask, clip):
    grad = jax.grad(_loss)
    total = jax.tree.map(jnp.zeros_like, trainable)
    for i in range(len(mask)):
        if mask[i] == 0:
            continue  # a masked row contributes nothing, whatever its gradient
        g = grad(trainable, frozen, {k: v[i] for k, v in data.items()})
        norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(g)))
        factor = mask[i] * min(1.0, clip / float(norm))
        total = jax.tree.map(lambda t, x, f=factor: t + f * x, total, g)
    return total


@pytest.mark.usefixtures("float32_products")
def test_clipped_sum_matches_naive_per_example_loop():
    data, trainable, frozen = _setup(n=16)
    mask = np.ones(16, np.float32)
    mask[[3, 11]] = 0
    clip = 0.7
    fn = jax.jit(dp_train.make_clipped_grad_sum(_loss, clip))
    shaped = {k: v.reshape(4, 4, *v.shape[1:]) for k, v in data.items()}
    got, _, counts = fn(trainable, frozen, shaped, mask.reshape(4, 4))
    want = _naive_clipped_sum(trainable, frozen, data, mask, clip)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=F32_SUM_ATOL)
    assert counts.clipped > 0  # the test exercises the clipping branch
    assert counts.nonfinite == 0


def test_sensitivity_of_the_clipped_sum_is_the_clip_norm():
    # Neighbouring datasets (one example removed, i.e. masked out): the L2 distance of the
    # sums is at most C, with equality when that example's gradient exceeds C.
    data, trainable, frozen = _setup(n=8, seed=1)
    clip = 0.3
    fn = jax.jit(dp_train.make_clipped_grad_sum(_loss, clip))
    shaped = {k: v.reshape(2, 4, *v.shape[1:]) for k, v in data.items()}
    full, _, _ = fn(trainable, frozen, shaped, np.ones((2, 4), np.float32))
    for i in range(8):
        mask = np.ones(8, np.float32)
        mask[i] = 0
        nb, _, _ = fn(trainable, frozen, shaped, mask.reshape(2, 4))
        diff = np.sqrt(
            sum(
                float(jnp.sum((a - b) ** 2))
                for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(nb))
            )
        )
        assert diff <= clip * (1 + 1e-5)


def test_noise_has_scale_sigma_c_over_b():
    sigma, clip, batch = 1.3, 0.5, 10
    update = jax.jit(
        dp_train.make_noisy_update(
            optax.sgd(-1.0), clip_norm=clip, noise_multiplier=sigma, expected_batch=batch
        )
    )
    params = {"w": jnp.zeros(20_000)}
    zero_sum = {"w": jnp.zeros(20_000)}
    opt = optax.sgd(-1.0)
    new, _ = update(params, opt.init(params), zero_sum, jax.random.key(3))
    samples = np.asarray(new["w"])
    scale = sigma * clip / batch
    assert stats.kstest(samples, stats.norm(scale=scale).cdf).pvalue > 0.01
    for wrong in (scale * 2 / 3, scale * 3 / 2):
        assert stats.kstest(samples, stats.norm(scale=wrong).cdf).pvalue < 1e-6


def test_poisson_sampler_rate_and_fixed_shapes():
    sampler = BatchSampler(1000, 50, 16, "poisson", secure_rng(0))
    sizes = [len(sampler.sample()) for _ in range(400)]
    assert abs(np.mean(sizes) - 50) < 1.5  # binomial(1000, 0.05): sd of the mean ~0.34
    chunks = list(sampler.chunks(np.arange(37)))
    assert [c.indices.shape for c in chunks] == [(16,)] * 3
    assert sum(c.mask.sum() for c in chunks) == 37
    assert len(list(sampler.chunks(np.arange(0)))) == 1  # empty batch: one masked chunk
    shuffle = BatchSampler(100, 10, 8, "shuffle", secure_rng(1))
    batch = shuffle.sample()
    assert len(batch) == len(set(batch.tolist())) == 10


def test_plan_and_bad_input():
    cfg = dp_train.DPConfig(batch_size=32, epochs=2, target_epsilon=4.0, accountant="rdp")
    plan = dp_train.plan_privacy(cfg, 640)
    assert plan.delta == 1 / 1280 and plan.steps == 40 and plan.epsilon <= 4.0
    want = accounting.dpsgd_epsilon(
        noise_multiplier=plan.noise_multiplier,
        num_examples=640,
        batch_size=32,
        steps=40,
        delta=1 / 1280,
        accountant="rdp",
    )
    assert plan.epsilon == want
    with pytest.raises(ValueError, match="empty"):
        dp_train.plan_privacy(cfg, 0)
    with pytest.raises(ValueError, match="delta"):
        dp_train.plan_privacy(dp_train.DPConfig(batch_size=4, delta=0.5, target_epsilon=1), 10)
    with pytest.raises(ValueError, match="target_epsilon"):
        dp_train.DPConfig(target_epsilon=0.0)
    with pytest.raises(ValueError, match="exactly one"):
        dp_train.DPConfig(noise_multiplier=1.0, target_epsilon=1.0)


def _cfg(**kw):
    base = dict(
        batch_size=16,
        epochs=4,
        clip_norm=1.0,
        learning_rate=0.05,
        noise_multiplier=0.5,
        target_epsilon=None,
        physical_batch=8,
        microbatch=4,
        seed=7,
        checkpoint_every=3,
    )
    base.update(kw)
    return dp_train.DPConfig(**base)


def test_training_reduces_loss_and_charges_ledger(tmp_path):
    data, trainable, frozen = _setup(n=128)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))
    result = dp_train.train(
        _loss,
        trainable,
        frozen,
        data,
        _cfg(epochs=8),
        progress=False,
        pay=ledger_payer(ledger, ("t", "toy"), stage="dp-train"),
    )
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:10])
    [charge] = ledger.charges("t", "toy")
    assert charge.stage == "dp-train"
    assert accounting.event_from_json(charge.event) == result.plan.event


def test_the_progress_bar_shows_steps_and_epsilon_only(capsys):
    """No examples/s, time per step or elapsed time: they reveal the realised Poisson batch
    sizes and n (tqdm shows rate and elapsed by default); no loss either."""
    data, trainable, frozen = _setup(n=64)
    result = dp_train.train(_loss, trainable, frozen, data, _cfg(epochs=1), progress=True)
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    steps = result.plan.steps
    assert final.startswith(f"dp-train: {steps}/{steps} steps")
    assert final.endswith(f"steps, eps {result.plan.epsilon_after(steps):.2f}")
    for leak in ("ex_s", "/s", "s/", "it/s", "<", "[", "loss", "00:"):
        assert leak not in err, (leak, err)


def test_resume_gives_the_same_run(tmp_path):
    data, trainable, frozen = _setup(n=64)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))
    full = dp_train.train(_loss, trainable, frozen, data, _cfg(), progress=False)
    ckpt = tmp_path / "ckpt"

    def run(**stop):  # in the work folder `ckpt`, paying from its payer
        cfg = _cfg()
        pay = WorkFolder(ckpt).payer(ledger, ("t", "toy"), stage="dp-train")
        return dp_train.train(
            _loss, trainable, frozen, data, cfg, progress=False, work_dir=ckpt, pay=pay, **stop
        )

    first = run(stop_after=7)
    assert first.steps_run == 7
    second = run()
    assert second.resumed_from == 7  # a stop saves a checkpoint
    assert second.steps_run == full.steps_run == full.plan.steps
    assert second.plan.epsilon == full.plan.epsilon
    for a, b in zip(jax.tree.leaves(second.trainable), jax.tree.leaves(full.trainable)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert len(ledger.charges("t", "toy")) == 1  # the resume did not charge again
    with pytest.raises(ValueError, match="different run"):
        dp_train.train(
            _loss,
            trainable,
            frozen,
            data,
            _cfg(noise_multiplier=0.9),
            progress=False,
            work_dir=ckpt,
            pay=WorkFolder(ckpt).payer(ledger, ("t", "toy"), stage="dp-train"),
        )
    with pytest.raises(ValueError, match="resume it with that ledger"):
        dp_train.train(_loss, trainable, frozen, data, _cfg(), progress=False, work_dir=ckpt)


def test_noise_multiplier_zero_is_an_explicit_non_private_run(tmp_path):
    config = dp_train.DPConfig(batch_size=8, epochs=1, noise_multiplier=0.0, target_epsilon=None)
    plan = dp_train.plan_privacy(config, 64)
    assert not plan.private and plan.epsilon == float("inf")
    assert plan.to_dict()["private"] is False
    data, trainable, frozen = _setup(n=64)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1e-3))
    with pytest.raises(ValueError, match="non-private"):
        dp_train.train(_loss, trainable, frozen, data, config, progress=False,
                       pay=ledger_payer(ledger, ("t", "d"), stage="dp-train"))  # fmt: skip
    assert ledger.charges("t", "d") == []
    result = dp_train.train(_loss, trainable, frozen, data, config, progress=False)
    assert result.steps_run == plan.steps


@pytest.mark.usefixtures("float32_products")
def test_a_non_finite_gradient_is_zeroed_and_counted_never_nan():
    data, trainable, frozen = _setup(n=16)
    data["x"][0, 2] = np.inf  # example 0's gradient is NaN (0 * inf in tanh')
    mask = np.ones(16, np.float32)
    mask[[5, 9]] = 0.0  # padding rows repeat example 0, as BatchSampler.chunks pads
    data_padded = {k: v.copy() for k, v in data.items()}
    for k in data_padded:
        data_padded[k][[5, 9]] = data[k][0]
    clip = 0.7
    fn = jax.jit(dp_train.make_clipped_grad_sum(_loss, clip))
    shaped = {k: v.reshape(4, 4, *v.shape[1:]) for k, v in data_padded.items()}
    got, loss_sum, counts = fn(trainable, frozen, shaped, mask.reshape(4, 4))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(got))
    assert np.isfinite(float(loss_sum))
    assert int(counts.nonfinite) == 1  # the real example 0 only, not the padding rows
    keep = mask.copy()
    keep[0] = 0.0  # the non-finite example contributes exactly nothing
    want = _naive_clipped_sum(trainable, frozen, data_padded, keep, clip)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=F32_SUM_ATOL)
    # A whole run stays finite and reports the count (to the operator only).
    data, trainable, frozen = _setup(n=64)
    data["x"][0] = np.inf
    result = dp_train.train(_loss, trainable, frozen, data, _cfg(), progress=False)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.trainable))
    assert result.nonfinite >= 1


def _zero_loss(trainable, frozen, ex):
    # A zero gradient for every example: the parameters move by the noise alone.
    return 0.0 * (jnp.sum(trainable["w"]) + jnp.sum(trainable["v"])) * ex["y"]


def _noise_only_run(seed):
    data, trainable, frozen = _setup(n=64)
    config = _cfg(epochs=1, seed=seed)
    out = dp_train.train(_zero_loss, trainable, frozen, data, config, progress=False)
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(out.trainable)])


def test_the_noise_depends_on_all_128_bits_of_the_seed():
    base = 12345
    same = _noise_only_run(base)
    np.testing.assert_array_equal(same, _noise_only_run(base))  # a fixed seed replays
    for high in (base + 2**40, base + 2**100, base + 2**127):  # equal low 32 (and 64) bits
        assert not np.allclose(same, _noise_only_run(high), rtol=0, atol=1e-7), hex(high)
    with pytest.raises(ValueError, match="seed"):
        dp_train.DPConfig(seed=2**128)


def test_run_seed_streams_keys_and_words():
    seeds = (7, 7 + 2**40, 7 + 2**100)
    streams = [run_seed.split_streams(s) for s in seeds]
    noise = jax.jit(lambda k, i: jax.random.normal(jax.random.fold_in(k, i), (8,)))
    draws = [np.asarray(noise(run_seed.noise_key(data), 3)) for _, data in streams]
    for i in range(len(seeds)):
        for j in range(i):
            assert not np.allclose(draws[i], draws[j])
            assert streams[i][0] != streams[j][0]  # the sampler seeds differ too
    sampler_seed, data = streams[0]
    assert data.shape == (4,) and data.dtype == np.uint32 and sampler_seed < 2**128
    assert run_seed.split_streams(7)[0] == sampler_seed  # deterministic for a fixed seed
    key = run_seed.noise_key(data)
    np.testing.assert_array_equal(jax.random.key_data(key), data)  # what checkpoints store
    for seed in (0, 1, 2**64 + 3, 2**128 - 1):
        assert run_seed.from_words(run_seed.to_words(seed)) == seed
    assert run_seed.shared_seed(None) != run_seed.shared_seed(None)  # OS entropy


def _pay(tmp_path, ledger, scope):
    """The payer of a run kept in tmp_path/work, as the commands build it."""
    return WorkFolder(tmp_path / "work").payer(ledger, scope, stage="dp-train")


def test_a_run_kept_in_a_work_folder_pays_through_that_folder(tmp_path):
    data, trainable, frozen = _setup(n=64)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))
    for pay in (
        ledger_payer(ledger, ("t", "toy"), stage="dp-train"),  # would charge a resume again
        WorkFolder(tmp_path / "elsewhere").payer(ledger, ("t", "toy"), stage="dp-train"),
    ):
        with pytest.raises(ValueError, match="pays through that folder"):
            dp_train.train(_loss, trainable, frozen, data, _cfg(), progress=False,
                           work_dir=tmp_path / "work", pay=pay)  # fmt: skip
    with pytest.raises(ValueError, match="pass that work_dir"):  # a second run would be free
        dp_train.train(_loss, trainable, frozen, data, _cfg(), progress=False,
                       pay=_pay(tmp_path, ledger, ("t", "toy")))  # fmt: skip
    assert ledger.charges("t", "toy") == []


def _charging_run(tmp_path, ledger, cfg=None, **kw):
    data, trainable, frozen = _setup(n=64)
    return dp_train.train(
        _loss, trainable, frozen, data, cfg or _cfg(), progress=False,
        work_dir=tmp_path / "work", pay=_pay(tmp_path, ledger, ("t", "toy")), **kw,
    )  # fmt: skip


def test_a_crash_after_the_charge_before_any_checkpoint_does_not_charge_twice(
    tmp_path, monkeypatch
):
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))

    def crash(self):
        raise RuntimeError("simulated crash in the first step")

    with monkeypatch.context() as patch:
        patch.setattr(BatchSampler, "sample", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            _charging_run(tmp_path, ledger)
    [charge] = ledger.charges("t", "toy")  # charged, but no checkpoint was written
    assert charge.ref is not None
    result = _charging_run(tmp_path, ledger)
    assert result.resumed_from == 0 and result.steps_run == result.plan.steps
    assert ledger.charges("t", "toy") == [charge]  # the restart found the same charge


def test_resuming_against_another_ledger_or_scope_is_refused(tmp_path):
    first = PrivacyLedger(tmp_path / "a.sqlite")
    first.open_scope(Scope("t", "toy", 100.0, 1e-3))
    _charging_run(tmp_path, first, stop_after=2)
    other = PrivacyLedger(tmp_path / "b.sqlite")
    other.open_scope(Scope("t", "toy", 100.0, 1e-3))
    with pytest.raises(ValueError, match="ledger"):
        _charging_run(tmp_path, other)
    assert other.charges("t", "toy") == []
    first.open_scope(Scope("t", "other", 100.0, 1e-3))
    data, trainable, frozen = _setup(n=64)
    with pytest.raises(ValueError, match="scope"):
        dp_train.train(
            _loss, trainable, frozen, data, _cfg(), progress=False, work_dir=tmp_path / "work",
            pay=_pay(tmp_path, first, ("t", "other")),
        )  # fmt: skip
    assert len(first.charges("t", "toy")) == 1 and first.charges("t", "other") == []


def test_a_refused_charge_leaves_a_work_folder_that_a_new_plan_may_reuse(tmp_path):
    data, trainable, frozen = _setup(n=64)
    big = dp_train.plan_privacy(_cfg(), 64)
    small = dp_train.plan_privacy(_cfg(noise_multiplier=5.0), 64)
    assert small.epsilon < big.epsilon
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", (small.epsilon + big.epsilon) / 2, small.delta))
    with pytest.raises(BudgetExceededError):
        _charging_run(tmp_path, ledger)
    assert ledger.charges("t", "toy") == []  # refused: nothing charged, no noise drawn
    result = dp_train.train(
        _loss, trainable, frozen, data, _cfg(noise_multiplier=5.0), progress=False,
        work_dir=tmp_path / "work", pay=_pay(tmp_path, ledger, ("t", "toy")),
    )  # fmt: skip
    assert result.steps_run == small.steps
    [charge] = ledger.charges("t", "toy")
    assert charge.epsilon == pytest.approx(small.epsilon)


def test_a_plan_for_another_sampling_scheme_is_refused_before_any_charge(tmp_path):
    poisson = dp_train.plan_privacy(_cfg(), 64)  # add/remove-one, Poisson batches
    data, trainable, frozen = _setup(n=64)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1e-3))
    pay = ledger_payer(ledger, ("t", "d"), stage="dp-train")
    with pytest.raises(ValueError, match="accounts for poisson sampling"):
        dp_train.train(_loss, trainable, frozen, data, _cfg(sampling="shuffle"), plan=poisson,
                       progress=False, pay=pay)  # fmt: skip
    assert ledger.charges("t", "d") == []


def test_a_restart_without_a_checkpoint_draws_the_first_attempts_batches_and_noise(tmp_path):
    """One charge, one draw: a run whose checkpoints are lost (a crash before the first one)
    replays its first attempt's seed, kept in the work folder before the charge."""
    import shutil

    import jax

    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))
    unseeded = _cfg(seed=None)  # 128 bits of OS entropy, as in a real run
    first = _charging_run(tmp_path, ledger, unseeded)
    assert (tmp_path / "work" / "run_seed.json").stat().st_mode & 0o777 == 0o600
    shutil.rmtree(tmp_path / "work" / "checkpoints")
    again = _charging_run(tmp_path, ledger, unseeded)
    assert again.resumed_from == 0 and len(ledger.charges("t", "toy")) == 1
    same = jax.tree.map(lambda a, b: bool((a == b).all()), first.trainable, again.trainable)
    assert all(jax.tree.leaves(same))
    other_ledger = PrivacyLedger(tmp_path / "m.sqlite")
    other_ledger.open_scope(Scope("t", "toy", 100.0, 1e-3))
    other = _charging_run(tmp_path / "other", other_ledger, unseeded)  # a new seed
    assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()),
                                                first.trainable, other.trainable)))  # fmt: skip
