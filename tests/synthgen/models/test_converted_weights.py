"""The machine-wide cache of converted GGUF weights: read once, loaded equal, keyed by file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import traverse_util

from synthgen.models import converted_weights, llama_loading
from synthgen.models.llama_loading import load_llama

FIXTURE = Path(__file__).parents[2] / "fixtures" / "llama_tiny" / "model.gguf"


@pytest.fixture
def cached_gguf(tmp_path, monkeypatch):
    """The tiny fixture GGUF placed inside a fresh toolkit cache, as a fetched asset is."""
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(converted_weights.DISABLE_ENV, raising=False)
    path = tmp_path / "cache" / "assets" / "tiny-0.1" / "model.gguf"
    path.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, path)
    return path


def _flat(params):
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


def _read_gguf_refused(path):
    raise AssertionError("the GGUF file was parsed although its converted copy exists")


def test_an_asset_is_parsed_once_and_loads_equal(cached_gguf, monkeypatch):
    uncached_config, uncached, _ = load_llama(FIXTURE)  # outside the cache: read directly
    folder = converted_weights.converted_folder(cached_gguf)
    assert not folder.exists()
    config, params, _ = load_llama(cached_gguf)
    assert (folder / "config.json").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging
    monkeypatch.setattr(llama_loading, "_read_gguf", _read_gguf_refused)
    again_config, again, _ = load_llama(cached_gguf)
    assert config == again_config == uncached_config
    want = _flat(uncached)
    for got in (_flat(params), _flat(again)):
        assert got.keys() == want.keys()
        for key, value in want.items():
            np.testing.assert_array_equal(got[key], value, err_msg=str(key))


def test_a_replaced_file_is_converted_again(cached_gguf):
    load_llama(cached_gguf)
    first = converted_weights.converted_folder(cached_gguf)
    stat = cached_gguf.stat()
    os.utime(cached_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = converted_weights.converted_folder(cached_gguf)
    assert second != first and not second.exists()
    load_llama(cached_gguf)
    assert (second / "config.json").is_file()


def test_no_copy_of_a_users_file_or_when_disabled(cached_gguf, tmp_path, monkeypatch):
    own = tmp_path / "mine" / "model.gguf"
    own.parent.mkdir()
    shutil.copy(FIXTURE, own)
    assert not converted_weights.applies_to(own)
    load_llama(own)
    monkeypatch.setenv(converted_weights.DISABLE_ENV, "1")
    assert not converted_weights.applies_to(cached_gguf)
    load_llama(cached_gguf)
    assert not (tmp_path / "cache" / "converted").exists()


def test_an_unwritable_cache_still_loads(cached_gguf, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("read-only file system")

    monkeypatch.setattr(converted_weights.tempfile, "mkdtemp", refuse)
    config, params, _ = load_llama(cached_gguf)
    assert config.num_layers == 2 and "lm_head" in params
    assert not converted_weights.converted_folder(cached_gguf).exists()


def test_a_damaged_folder_is_removed_and_converted_again(cached_gguf):
    _, want, _ = load_llama(cached_gguf)
    folder = converted_weights.converted_folder(cached_gguf)
    victim = sorted((folder / "tensors").glob("*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # a file cut short by a crash
    _, params, _ = load_llama(cached_gguf)
    assert (folder / "config.json").is_file() and victim.stat().st_size > 100
    for key, value in _flat(want).items():
        np.testing.assert_array_equal(_flat(params)[key], value, err_msg=str(key))
