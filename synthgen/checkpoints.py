"""Orbax checkpoints of a DP training run: parameters, optimizer, step, PRNG and sampler state.

The JSON part holds the privacy plan (so a resumed run is checked to be the same run and ends
with the same epsilon and step count), the batch sampler's generator state, and whether the
run's guarantee was already charged to the ledger (so a resume never charges twice).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


@dataclasses.dataclass
class Restored:
    step: int
    trainable: Any
    opt_state: Any
    noise_key: np.ndarray
    meta: dict


def has_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` holds a saved step (orbax names step folders by number)."""
    directory = Path(directory)
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


class TrainCheckpoints:
    """Keeps the latest two checkpoints of a run under `directory`."""

    def __init__(self, directory: str | Path, *, max_to_keep: int = 2) -> None:
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def save(self, step: int, trainable, opt_state, noise_key, meta: dict) -> None:
        state = {"trainable": trainable, "opt_state": opt_state, "noise_key": np.asarray(noise_key)}
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        self._manager.wait_until_finished()

    def restore_latest(self, trainable, opt_state) -> Restored | None:
        """Restores the newest checkpoint into the structure of the given templates."""
        step = self._manager.latest_step()
        if step is None:
            return None
        template = {
            "trainable": trainable,
            "opt_state": opt_state,
            "noise_key": np.zeros((2,), np.uint32),
        }
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        state = restored["state"]
        return Restored(
            step,
            state["trainable"],
            state["opt_state"],
            np.asarray(state["noise_key"]),
            restored["meta"],
        )

    def close(self) -> None:
        self._manager.close()
