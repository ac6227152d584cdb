"""The audits' one resumable loop over cells, and reading a cell's result file back.

Every audit writes one JSON file per cell and reads it back instead of re-running the cell
(resumable runs: `resumable_cells`). A file is named by the cell's kind, label, m and
epsilon only, so a run with changed settings (more texts, another epoch count, another
delta) would silently reuse a stale result; `read_back` compares the settings a run asks
for with those the file records.

Privacy:
  Result files hold aggregates only (each audit's result type; see its module): the loop
  writes `to_dict()` of each result and nothing else.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
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


def resumable_cells(
    epsilons: Sequence[float],
    path_of: Callable[[float], Path],
    run: Callable[[float, int], Any],
    result_type: type,
    *,
    expect: Mapping[str, Any],
    log: Callable[[str], None] = print,
    describe: Callable[[Any], str] = lambda result: f"{result.seconds:.1f} s",
) -> list:
    """Runs (or reads back) one cell per epsilon, in order; resumable by cell.

    Args:
      epsilons: the cells' claimed epsilons (math.inf: noise off).
      path_of: the result file of the cell at an epsilon (its folder is created if needed).
      run: run(epsilon, k) -> the result of cell k (k: its position, for test seeds).
      result_type: the result dataclass (`to_dict` writes it, `from_dict` reads it back).
      expect: the settings `run` uses: a file that records others is refused
        (`read_back`), not reused.
      log: progress lines (file names and `describe` of each result only).
      describe: the public figures of a result for its progress line.

    Returns:
      One result per epsilon. A cell whose file exists is read back; an interrupted cell
      is re-run whole (its file is written at its end, atomically).
    """
    results = []
    for k, epsilon in enumerate(epsilons):
        path = path_of(epsilon)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            results.append(read_back(path, result_type, expect))
            log(f"{path.name}: exists, skipped")
            continue
        result = run(epsilon, k)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=1))
        tmp.replace(path)
        log(f"{path.name}: {describe(result)}")
        results.append(result)
    return results
