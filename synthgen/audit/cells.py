"""Reading an audit cell's result file back, refusing one made with other settings.

Every audit writes one JSON file per cell and reads it back instead of re-running the cell
(resumable runs). A file is named by the cell's kind, label, m and epsilon only, so a run
with changed settings (more texts, another epoch count, another delta) would silently reuse a
stale result; `read_back` compares the settings a run asks for with those the file records.

Privacy:
  Result files hold aggregates only (see each audit's module); nothing here writes.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Free-text descriptions, not settings: a reworded description keeps a cell valid.
DESCRIPTIVE = frozenset({"model"})


def _same(asked: Any, stored: Any) -> bool:
    if isinstance(asked, (int, float)) and isinstance(stored, (int, float)):
        return math.isclose(asked, stored, rel_tol=1e-9)  # a float's JSON round trip
    return asked == stored


def settings_of(function: Callable, **given: Any) -> dict[str, Any]:
    """The settings a call `function(..., **given)` runs with: its keyword defaults, then
    `given`; so that a changed module default also refuses an older file."""
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    return {**defaults, **given}


def stale_settings(stored: Mapping[str, Any], expect: Mapping[str, Any]) -> list[str]:
    """`name: file value != asked value` for every scalar setting the file records differently.

    Not compared: settings the file does not record (or records under another name, e.g.
    resolved), settings asked as None (a default the file records resolved), non-scalar
    settings (templates, encoders, callables) and `DESCRIPTIVE` fields. So the check
    catches the sizes, mechanisms and deltas each result records, not every argument.
    """
    differences = []
    for name, asked in expect.items():
        if name in DESCRIPTIVE or name not in stored:
            continue
        if asked is None or not isinstance(asked, (str, int, float, bool)):
            continue
        if not _same(asked, stored[name]):
            differences.append(f"{name}: file {stored[name]!r} != asked {asked!r}")
    return differences


def read_back(path: str | Path, result_type: type, expect: Mapping[str, Any]):
    """`result_type.from_dict` of the cell file at `path`, after checking its settings.

    Raises:
      ValueError: the file records a setting other than the one `expect` asks for; the
        message names the file and each difference (delete the file or use a new folder).
    """
    path = Path(path)
    stored = json.loads(path.read_text())
    differences = stale_settings(stored, expect)
    if differences:
        raise ValueError(
            f"{path} was made with other settings ({'; '.join(differences)}); delete it to "
            "re-run the cell, or write to a new folder"
        )
    return result_type.from_dict(stored)
