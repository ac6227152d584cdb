"""One process of a two-process `jax.distributed` DP training run on CPU (gloo collectives).

Run by tests/synthgen/test_dp_train_multihost.py: `python multihost_worker.py PID PORT LEDGER`.
Prints one JSON line with the trained parameters of a run with an OS-entropy seed and of a
run with seed 0, and the run seeds the processes agree on.
"""

import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=2, process_id=int(sys.argv[1]))

import numpy as np  # noqa: E402

from synthgen import dp_train, run_seed  # noqa: E402
from synthgen.privacy.ledger import PrivacyLedger  # noqa: E402
from synthgen.privacy.ledger_types import Scope  # noqa: E402
from synthgen.privacy.receipts import ledger_payer  # noqa: E402

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_dp_train import _loss, _setup  # noqa: E402


def config(seed):
    return dp_train.DPConfig(
        batch_size=16, epochs=1, clip_norm=1.0, learning_rate=0.05, noise_multiplier=1.0,
        target_epsilon=None, physical_batch=8, microbatch=2, seed=seed,
    )  # fmt: skip


data, trainable, frozen = _setup(n=64)
out = {"devices": jax.device_count(), "processes": jax.process_count()}
# Each process proposes its own seed; all 128 bits of process 0's must reach every process.
pid = int(sys.argv[1])
out["shared"] = [str(run_seed.shared_seed(None)), str(run_seed.shared_seed(2**127 + 2**70 + pid))]
# The entropy run is charged to a ledger shared by both processes: once, by process 0.
ledger = PrivacyLedger(sys.argv[3])
ledger.ensure_scope(Scope("multi", "host", 100.0, 1e-3))
for name, seed in (("entropy", None), ("seed0", 0)):
    pay = ledger_payer(ledger, ("multi", "host"), stage="dp-train")
    charged = {} if seed is not None else {"pay": pay}
    result = dp_train.train(_loss, trainable, frozen, data, config(seed), progress=False, **charged)
    out[name] = {k: np.asarray(v).tolist() for k, v in result.trainable.items()}
print(json.dumps(out))
