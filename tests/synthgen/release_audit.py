"""Test helper: record a DP run's secret randomness and search a folder's bytes for it.

Imported by tests/synthgen/test_release_folder.py and tests/retriever/test_train.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from synthgen import run_seed
from synthgen.batching import BatchSampler


def record_randomness(monkeypatch) -> dict:
    """Records every noise key data the run wraps and every sampler state it passes through."""
    seen: dict = {"keys": [], "states": []}
    wrap, sample = run_seed.noise_key, BatchSampler.sample

    def noise_key(data):
        seen["keys"].append(np.asarray(data, np.uint32).copy())
        return wrap(data)

    def recorded_sample(self):
        seen["states"].append(copy.deepcopy(self.rng.bit_generator.state))
        indices = sample(self)
        seen["states"].append(copy.deepcopy(self.rng.bit_generator.state))
        return indices

    monkeypatch.setattr(run_seed, "noise_key", noise_key)
    monkeypatch.setattr(BatchSampler, "sample", recorded_sample)
    return seen


def needles(seen: dict) -> list[bytes]:
    """Byte strings that would reveal the noise key or a sampler state: little- and
    big-endian bytes and decimal text."""
    assert seen["keys"] and seen["states"], "the run drew no noise key or no batch"
    found: list[bytes] = []
    for key in seen["keys"]:
        found += [key.astype("<u4").tobytes(), key.astype(">u4").tobytes()]
        found.append(str(run_seed.from_words(key)).encode())
        for sep in (", ", ",", " "):
            found.append(sep.join(str(int(w)) for w in key).encode())
    for state in seen["states"]:
        for name in ("state", "inc"):
            value = int(state["state"][name])
            found += [str(value).encode(), value.to_bytes(16, "little")]
            found.append(value.to_bytes(16, "big"))
    return found


def files_containing(folder: Path, patterns: list[bytes]) -> list[str]:
    """Relative paths of the files under `folder` whose bytes contain any of `patterns`."""
    hits = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if any(p in data for p in patterns):
                hits.append(str(path.relative_to(folder)))
    return hits


def assert_clean_release(folder: Path, seen: dict) -> None:
    """No file of `folder` holds the run's secret randomness; no checkpoint folder."""
    assert Path(folder).is_dir()
    assert files_containing(folder, needles(seen)) == []
    names = {p.name for p in Path(folder).rglob("*")}
    assert "checkpoints" not in names and "charge.json" not in names
    assert not any(n.startswith(("_CHECKPOINT", "ocdbt", "_METADATA")) for n in names), names
    assert not any(p.name.isdigit() for p in Path(folder).rglob("*") if p.is_dir())
