"""Reads Hugging Face safetensors checkpoints (one file, or a folder with one file or a
sharded index) into numpy arrays, for the T5 and BERT loaders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open


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
