"""Sphinx configuration of the dpsynth documentation (MyST Markdown, autodoc + napoleon, furo).

Build: `make docs` (warnings are errors; `make test` builds it too).
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# autodoc imports the project, which imports datasets; its import-time INFO line ("JAX
# version ... available") is not the docs build's business
logging.getLogger("datasets").setLevel(logging.WARNING)

project = "dpsynth"
author = "the dpsynth authors"
copyright = "2026, the dpsynth authors"  # noqa: A001 (Sphinx's name)
release = _version("dpsynth")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: GitHub-style heading anchors, so `[text](page.md#a-heading)` works on GitHub and here.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# Google docstrings; the `Privacy:` section every DP function carries renders as its own
# heading (HOUSE_STYLE.md, privacy rule 1).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ["Privacy", "Guarantee"]
napoleon_use_rtype = False
napoleon_use_ivar = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# Forward references under `if TYPE_CHECKING:` and third-party types need not resolve.
nitpicky = False

html_theme = "furo"
html_title = f"dpsynth {release}"
html_static_path: list[str] = []
