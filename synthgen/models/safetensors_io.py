"""Reads Hugging Face safetensors checkpoints (one file, or a folder with one file or a
sharded index) into numpy arrays, and converts them to Flax parameters by name, for the T5
and BERT loaders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from safetensors import safe_open

PyTree = Any


def read_safetensors(path: Path, dtype: Any = None) -> dict[str, np.ndarray]:
    """All tensors of `path` (a file, or a directory with one file or a sharded index).

    Tensors are cast to `dtype` as they are read; None keeps the stored dtype.
    """
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            files = [path / shard for shard in shards]
        elif (path / "model.safetensors").exists():
            files = [path / "model.safetensors"]
        else:
            raise FileNotFoundError(
                f"no model.safetensors in {path} (PyTorch .bin checkpoints are not supported: "
                "convert with transformers' save_pretrained(safe_serialization=True))"
            )
    else:
        files = [path]
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as f:  # bf16 via ml_dtypes
            for name in f.keys():
                tensor = f.get_tensor(name)
                tensors[name] = tensor if dtype is None else np.asarray(tensor).astype(dtype)
    return tensors


def params_by_name(
    name_map: dict[tuple[str, ...], tuple[str, bool]],
    shapes: PyTree,
    tensors: dict[str, np.ndarray],
    family: str,
    where: str,
) -> PyTree:
    """Flax params of the tree `shapes` from HF-named tensors, converted by name, never by
    position: each path takes its `name_map` tensor (transposed where marked) as float32.

    Paths of `name_map` outside `shapes` are skipped (e.g. a T5 decoder for an encoder).

    Raises:
      ValueError: a missing, mis-shaped or unused tensor (named in the message).
    """
    expected = {k: v.shape for k, v in traverse_util.flatten_dict(shapes).items()}
    tensors, flat = dict(tensors), {}
    for path, (name, transpose) in name_map.items():
        if path not in expected:
            continue
        if name not in tensors:
            raise ValueError(f"{where} lacks {family} tensor {name=}")
        value = np.asarray(tensors.pop(name), np.float32)
        value = np.ascontiguousarray(value.T) if transpose else value
        if value.shape != expected[path]:
            raise ValueError(f"tensor {name=} has shape {value.shape}, expected {expected[path]}")
        flat[path] = jnp.asarray(value)
    if tensors:
        raise ValueError(f"{where} has {len(tensors)} unused tensors, e.g. {sorted(tensors)[0]=}")
    return traverse_util.unflatten_dict(flat)
