"""Where dpsynth keeps its files: a deletable cache, a durable data folder, private work."""

from __future__ import annotations

import hashlib
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


def default_ledger_help() -> str:
    """What a ``--ledger`` help says of its default: the rule, and where it points here.

    Computed when the command line is built (at ``--help``) by `default_ledger_path`, the
    function the commands call when ``--ledger`` is left out.
    """
    return (
        f"default: $DPSYNTH_LEDGER, else <data folder>/dpsynth/ledger.sqlite; "
        f"here {default_ledger_path()}"
    )


def default_work_dir(release_dir: str | Path, ledger_path: str | Path | None = None) -> Path:
    """Private work folder of the DP run that releases into `release_dir`.

    ``<ledger folder>/work/<release folder name>-<12 hex of sha256(its absolute path)>``:
    beside the ledger (the default ledger's for None or a server URL), never inside the
    release folder, and the same for every run of the same release (calling again resumes).

    Privacy:
      The work folder holds the mechanism's secret randomness (noise key, sampler state) and
      the resume state; it is secret and must never be shipped (`synthgen.work_folder`).
    """
    release = Path(release_dir).expanduser().resolve()
    text = None if ledger_path is None else str(ledger_path)
    if text is not None and text.startswith("sqlite:"):
        text = text.removeprefix("sqlite:///")
    elif text is not None and "://" in text:  # a server ledger: the default ledger's folder
        text = None
    ledger = Path(text) if text is not None else default_ledger_path()
    digest = hashlib.sha256(str(release).encode()).hexdigest()[:12]
    return ledger.expanduser().resolve().parent / "work" / f"{release.name}-{digest}"
