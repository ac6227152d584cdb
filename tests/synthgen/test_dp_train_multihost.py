"""Multi-host DP training: two `jax.distributed` processes on loopback act as one run."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from throwaway_server import free_port

from synthgen import dp_train

WORKER = Path(__file__).parent / "multihost_worker.py"


@pytest.mark.slow
def test_two_processes_draw_the_same_batches_and_noise(tmp_path):
    port = str(free_port())
    ledger_path = tmp_path / "ledger.sqlite"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(pid), port, str(ledger_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in (0, 1)
    ]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-2000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert all(o["devices"] == 2 and o["processes"] == 2 for o in outs)
    # Two processes ran one mechanism: the ledger holds one charge, not two.
    from synthgen.privacy.ledger import PrivacyLedger

    assert len(PrivacyLedger(ledger_path).charges("multi", "host")) == 1
    # The run seed is broadcast whole (128 bits): process 0's, on both processes.
    assert outs[0]["shared"] == outs[1]["shared"]
    assert outs[0]["shared"][1] == str(2**127 + 2**70)
    # Production seeds come from each process's OS entropy; process 0's is broadcast, so
    # both processes ran the same mechanism and hold the same parameters.
    for key in outs[0]["entropy"]:
        np.testing.assert_array_equal(outs[0]["entropy"][key], outs[1]["entropy"][key])
    # With a fixed seed, the two-process run equals the single-process one.
    sys.path.insert(0, str(Path(__file__).parent))
    from test_dp_train import _loss, _setup

    data, trainable, frozen = _setup(n=64)
    config = dp_train.DPConfig(
        batch_size=16, epochs=1, clip_norm=1.0, learning_rate=0.05, noise_multiplier=1.0,
        target_epsilon=None, physical_batch=8, microbatch=2, seed=0,
    )  # fmt: skip
    single = dp_train.train(_loss, trainable, frozen, data, config, progress=False)
    for key, value in single.trainable.items():
        np.testing.assert_allclose(outs[0]["seed0"][key], np.asarray(value), rtol=1e-5, atol=1e-6)
