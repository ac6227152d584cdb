"""The code layout page is generated from the code: every module, its docstring's summary."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dpsynth.code_layout import HEADER, code_layout

ROOT = Path(__file__).resolve().parents[1]
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _rows(text: str) -> dict[str, tuple[str, str]]:
    """Path of each table row (its section's folder / its name) -> (description, lines)."""
    rows, folder = {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            folder = line.lstrip("#").strip()
        elif line.startswith("| `") and folder:
            name, description, lines = (c.strip() for c in _CELL_SPLIT.split(line)[1:-1])
            rows[folder + name.strip("`")] = (description.replace("\\|", "|"), lines)
    return rows


def _summary(path: Path) -> str:
    """Written here from the docstring rule, not taken from the module under test."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert doc, f"{path} has no docstring"
    first_paragraph = doc.split("\n\n")[0]
    return " ".join(line.strip() for line in first_paragraph.splitlines())


def test_every_module_and_script_is_listed_with_its_docstring_and_length():
    text = code_layout(ROOT, ("synthgen", "retriever", "dpsynth"), scripts=("scripts",))
    assert text.startswith(HEADER + "\n")
    rows = _rows(text)
    files = [
        path
        for folder in ("synthgen", "retriever", "dpsynth", "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts and path.name != "__init__.py"
    ]
    assert len(files) > 100  # the walk found the packages
    for path in files:
        key = path.relative_to(ROOT).as_posix()
        assert key in rows, f"{key} is missing from the layout"
        description, lines = rows[key]
        assert description == _summary(path), key
        assert lines == str(len(path.read_text(encoding="utf-8").splitlines())), key
    for folder in ("synthgen", "retriever", "dpsynth"):  # every package has its section
        for init in (ROOT / folder).rglob("__init__.py"):
            package = init.parent.relative_to(ROOT).as_posix()
            assert re.search(rf"^#+ {re.escape(package)}/$", text, re.M), package
    # no row names a module that is not there
    modules = {path.relative_to(ROOT).as_posix() for path in files}
    assert {key for key in rows if key.endswith(".py")} == modules


def test_a_summary_that_wraps_is_one_line_and_a_pipe_stays_in_its_cell(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b.py").write_text(
        '"""`cmd a | b`: a summary that\n  wraps.\n\nDetails."""\nx = 1\n'
    )
    (package / "a.py").write_text('"""First."""\n')
    (package / "page.html").write_text("<p></p>")
    text = code_layout(tmp_path, ("pkg",))
    assert text == code_layout(tmp_path, ("pkg",))  # deterministic
    assert text.index("`a.py`") < text.index("`b.py`")  # sorted
    assert "| `b.py` | `cmd a \\| b`: a summary that wraps. | 5 |" in text
    assert _rows(text)["pkg/b.py"] == ("`cmd a | b`: a summary that wraps.", "5")
    assert "Other files: `page.html`." in text


def test_a_module_without_a_docstring_fails_and_is_named(tmp_path):
    """Every module without a docstring is named in one ValueError; an empty __init__ is a
    bare package marker and passes, an __init__ with code and no docstring does not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text('"""Has one."""\n')
    (package / "sub" / "__init__.py").write_text("from pkg.good import *\n")
    (package / "sub" / "bad.py").write_text("x = 1  # no docstring\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "run.py").write_text("print('no docstring')\n")
    with pytest.raises(ValueError, match="without a docstring") as raised:
        code_layout(tmp_path, ("pkg",), scripts=("scripts",))
    message = str(raised.value)
    for name in ("pkg/sub/__init__.py", "pkg/sub/bad.py", "scripts/run.py"):
        assert name in message
    assert "good.py" not in message and "pkg/__init__.py" not in message

    (package / "sub" / "__init__.py").write_text('"""A sub-package."""\n')
    (package / "sub" / "bad.py").write_text('"""Fixed."""\nx = 1\n')
    (scripts / "run.py").write_text('"""Runs."""\n')
    rows = _rows(code_layout(tmp_path, ("pkg",), scripts=("scripts",)))
    assert rows["pkg/sub/bad.py"] == ("Fixed.", "2")
    assert rows["pkg/sub/"] == ("A sub-package.", "3")  # the lines of all its modules
    assert rows["scripts/run.py"] == ("Runs.", "1")
