"""A machine-wide cache of converted GGUF weights: a llama.cpp file is parsed once.

Reading a GGUF file costs seconds on every load (gguf-py parses the tokenizer metadata in
Python and dequantises every tensor). The first load of a fetched asset writes what it read
to ``<cache>/converted/<file stem>-<key>/`` (``config.json``, ``tokenizer/``, and
``tensors/<name>.npy``: float32 under the Hugging Face names and layout, rotary rows
un-permuted); later loads memory-map the arrays. Weights are public; nothing private is
stored. See docs/guides/assets.md (timings, ``DPSYNTH_NO_CONVERTED_CACHE=1``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
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
    """Where the converted copy of the GGUF file `source` lives (it may not exist yet).

    The key covers the file (path, size, modification time), `FORMAT` and the gguf
    package's version (its dequantiser wrote the arrays): a change to any converts again.
    """
    source = Path(source).resolve()
    stat = source.stat()
    identity = f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{FORMAT}|{_gguf_version()}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir() / "converted" / f"{source.stem}-{key}"


def applies_to(source: Path) -> bool:
    """Whether `source` is converted: a file inside the toolkit's cache (a fetched asset),
    unless ``DPSYNTH_NO_CONVERTED_CACHE`` is set. A user's own file is read each time."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return False
    return Path(source).resolve().is_relative_to(cache_dir().resolve())


def _gguf_version() -> str:
    try:
        return importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def load(
    folder: Path, names: Callable[[dict], Iterable[str]]
) -> tuple[dict, Reader, BpeTokenizer | None] | None:
    """(config, reader, tokenizer) of a converted folder; None when there is none.

    Every array `names(config)` lists is opened (memory-mapped) before anything is
    returned; a damaged folder (a crash mid-write on a disk that reordered it, a file
    removed by hand) is removed and None returned, so the caller converts again. The
    reader hands out copies: no parameter aliases the cache file.
    """
    if not (folder / "config.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
        arrays = {
            name: np.load(folder / "tensors" / f"{name}.npy", mmap_mode="r")
            for name in names(config)
        }
        tokenizer = None
        if (folder / "tokenizer" / "tokenizer.json").is_file():
            tokenizer = BpeTokenizer.from_pretrained_dir(folder / "tokenizer")
    except (OSError, ValueError, KeyError, EOFError):
        shutil.rmtree(folder, ignore_errors=True)
        return None

    def get(name: str) -> np.ndarray:
        if name not in arrays:
            raise ValueError(f"converted weights lack a tensor: {name=} ({folder})")
        return np.array(arrays[name], np.float32)

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
