"""Data parallel DP training over 2 host devices gives the single-device result."""

import json
import subprocess
import sys
import textwrap

from xla_env import with_xla_flags

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from synthgen import dp_train
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64, 5)).astype(np.float32),
            "y": rng.normal(size=(64,)).astype(np.float32)}
    def loss(tr, fr, ex):
        return (jnp.tanh(ex["x"] @ tr["w"]).sum() - ex["y"]) ** 2
    cfg = dp_train.DPConfig(batch_size=16, epochs=2, clip_norm=1.0, learning_rate=0.05,
                            noise_multiplier=0.5, target_epsilon=None, physical_batch=8,
                            microbatch=4, seed=3)
    out = dp_train.train(loss, {"w": jnp.ones((5, 3)) * 0.1}, {}, data, cfg, progress=False)
    print(json.dumps({"devices": jax.device_count(),
                      "w": np.asarray(out.trainable["w"]).tolist()}))
""")


def _run(devices):
    env = with_xla_flags(f"--xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_two_devices_match_one():
    one, two = _run(1), _run(2)
    assert (one["devices"], two["devices"]) == (1, 2)
    diff = max(abs(a - b) for ra, rb in zip(one["w"], two["w"]) for a, b in zip(ra, rb))
    assert diff < 1e-5
