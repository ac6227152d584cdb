"""A machine-wide cache of converted GGUF weights: a llama.cpp file is parsed once.

Reading a GGUF file costs seconds on every load: gguf-py parses every tokenizer entry of the
metadata in Python, and every tensor is dequantised (SmolLM2-135M: about 6 s on 2 cores, in
every process that loads it: each `retriever answer`, each pipeline stage, each test). The
first load writes what it read to ``<cache>/converted/<file stem>-<key>/``:

* ``config.json``: the Llama hyper-parameters read from the metadata;
* ``tokenizer/``: tokenizer.json and tokenizer_config.json (`BpeTokenizer.save_pretrained_dir`);
* ``tensors/<name>.npy``: every tensor as float32, under its Hugging Face name and layout,
  rotary rows already un-permuted: exactly what the GGUF reader hands to the assembler.

Later loads memory-map the arrays (well under a second). The key hashes the file's resolved
path, size and modification time and `FORMAT`, so a replaced file, or a change to what is
stored, converts again. A folder is written under a temporary name and renamed into place,
so concurrent first loads (test workers, replicas) never read half a cache. Only files inside
the cache (fetched assets) are converted, so a user's own file leaves no copy behind. Weights
are public; nothing private is stored. Set ``DPSYNTH_NO_CONVERTED_CACHE=1`` to read the file
every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from synthgen.models.bpe_tokenizer import BpeTokenizer
from synthgen.paths import cache_dir

FORMAT = 1
DISABLE_ENV = "DPSYNTH_NO_CONVERTED_CACHE"

Reader = Callable[[str], np.ndarray]


def converted_folder(source: Path) -> Path:
    """Where the converted copy of the GGUF file `source` lives (it may not exist yet)."""
    source = Path(source).resolve()
    stat = source.stat()
    identity = f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{FORMAT}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir() / "converted" / f"{source.stem}-{key}"


def applies_to(source: Path) -> bool:
    """Whether `source` is converted: a file inside the toolkit's cache (a fetched asset),
    unless ``DPSYNTH_NO_CONVERTED_CACHE`` is set. A user's own file is read each time."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return False
    return Path(source).resolve().is_relative_to(cache_dir().resolve())


def load(folder: Path) -> tuple[dict, Reader, BpeTokenizer | None] | None:
    """(config, reader, tokenizer) of a converted folder, or None when there is none."""
    if not (folder / "config.json").is_file():
        return None
    config = json.loads((folder / "config.json").read_text())
    tensors = folder / "tensors"

    def get(name: str) -> np.ndarray:
        path = tensors / f"{name}.npy"
        if not path.is_file():
            raise ValueError(f"converted weights lack a tensor: {name=} ({folder})")
        return np.load(path, mmap_mode="r")

    tokenizer = None
    if (folder / "tokenizer" / "tokenizer.json").is_file():
        tokenizer = BpeTokenizer.from_pretrained_dir(folder / "tokenizer")
    return config, get, tokenizer


def save(
    folder: Path,
    config: dict,
    get: Reader,
    names: Iterable[str],
    tokenizer: BpeTokenizer | None,
) -> bool:
    """Writes a converted folder atomically; False (and nothing written) when it cannot.

    A cache that cannot be written (read-only or full disk) is not an error: the caller
    keeps the weights it read.
    """
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    except OSError:
        return False
    try:
        (staging / "tensors").mkdir()
        for name in names:
            np.save(staging / "tensors" / f"{name}.npy", np.asarray(get(name), np.float32))
        if tokenizer is not None:
            tokenizer.save_pretrained_dir(staging / "tokenizer")
        (staging / "config.json").write_text(json.dumps(config))  # written last: complete
        os.rename(staging, folder)
        return True
    except OSError:  # full disk, or another process renamed its copy first
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
