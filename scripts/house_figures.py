"""The house's shape in figures (issue 71's table): sizes, long files and functions, where
the ledger is charged, which algorithms take a ledger scope, hand-written bisections.

Reads the source as text and syntax trees (imports nothing of the project). The last line
is ``key=value`` pairs, one per figure.

    python scripts/house_figures.py            # this checkout
    python scripts/house_figures.py OTHER_TREE # another checkout (e.g. a git worktree)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("synthgen", "retriever", "dpsynth")
PRIVACY_CORE = ("synthgen/privacy/", "synthgen/work_folder.py")


def _files(*folders: str) -> list[Path]:  # below ROOT
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def figures() -> dict[str, int]:
    source = _files(*PACKAGES)
    lines = {p: len(p.read_text().splitlines()) for p in source}
    scripts = sum(len(p.read_text().splitlines()) for p in _files("scripts"))
    out = {
        "python_lines_packages": sum(lines.values()),
        "python_lines_scripts": scripts,
        "library_files_over_600": 0,
        "functions_over_100": 0,
        "cli_functions_over_60": 0,
        "ledger_charge_outside_core": 0,
        "signatures_with_ledger_scope": 0,
        "hand_written_bisections": 0,
    }
    for path in source:
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        cli = "/cli/" in rel or rel.endswith("cli_options.py")
        if not cli and lines[path] > 600:
            out["library_files_over_600"] += 1
        for fn in _functions(ast.parse(text)):
            length = fn.end_lineno - fn.lineno + 1
            out["functions_over_100"] += length > 100
            out["cli_functions_over_60"] += cli and length > 60
            names = [a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)]
            out["signatures_with_ledger_scope"] += "ledger_scope" in names
        if not rel.startswith(PRIVACY_CORE):
            out["ledger_charge_outside_core"] += len(re.findall(r"ledger\.charge\(", text))
        if not rel.endswith("privacy/calibration.py"):
            out["hand_written_bisections"] += len(re.findall(r"\bmid = ", text))
    return out


def main() -> int:
    global ROOT
    if len(sys.argv) > 1:
        ROOT = Path(sys.argv[1]).resolve()
    values = figures()
    for key, value in values.items():
        print(f"{key:32s} {value}")
    print(" ".join(f"{k}={v}" for k, v in values.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
