"""Where dpsynth keeps its files: a deletable cache and a durable data folder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Asset cache: ``$DPSYNTH_CACHE``, else ``$XDG_CACHE_HOME/dpsynth`` or ``~/.cache/dpsynth``."""
    if os.environ.get("DPSYNTH_CACHE"):
        return Path(os.environ["DPSYNTH_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "dpsynth"


def default_ledger_path() -> Path:
    """Budget ledger: ``$DPSYNTH_LEDGER``, else ``$XDG_DATA_HOME/dpsynth/ledger.sqlite``.

    The ledger is not a cache: deleting it forgets spent budget, so it lives in the data
    folder (``~/.local/share`` by default), never under the cache.
    """
    if os.environ.get("DPSYNTH_LEDGER"):
        return Path(os.environ["DPSYNTH_LEDGER"]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(xdg) / "dpsynth" / "ledger.sqlite"
