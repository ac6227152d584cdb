"""Orbax checkpoints of a training run: parameters, optimizer, step, PRNG and sampler state.

The JSON part holds the privacy plan (a resumed run is checked to be the same run) and the
batch sampler's state; the charge is recorded in the work folder (`synthgen.work_folder`).

Privacy:
  A DP run's checkpoints hold the mechanism's secret randomness (noise key data, sampler
  state): they belong in the run's private work folder, never in a released folder.
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
    noise_key: np.ndarray | None
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
        """Saves a step; `noise_key` is the PRNG key data (uint32 array) or None."""
        state = {"trainable": trainable, "opt_state": opt_state}
        if noise_key is not None:
            state["noise_key"] = np.asarray(noise_key)
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
        )
        self._manager.wait_until_finished()

    def restore_latest(self, trainable, opt_state, noise_key=None) -> Restored | None:
        """Restores the newest checkpoint into the structure of the given templates.

        `noise_key` is a template of the saved key data (shape and dtype), or None if the
        run saved none.
        """
        step = self._manager.latest_step()
        if step is None:
            return None
        template = {"trainable": trainable, "opt_state": opt_state}
        if noise_key is not None:
            template["noise_key"] = np.asarray(noise_key)
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
            None if noise_key is None else np.asarray(state["noise_key"]),
            restored["meta"],
        )

    def close(self) -> None:
        self._manager.close()
