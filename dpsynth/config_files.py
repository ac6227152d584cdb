"""Config files loaded by path: the packaged examples (`dpsynth/configs/`) and the user's own.

Config files are Python files, loaded by path (as in t5x and the flax examples, where
`--config path/to/file.py` names a file): each file defines frozen dataclass presets and is
imported from its path with `importlib`, so a user can copy one, change it and pass the copy
without installing anything. The files are ordinary modules (dataclass instances, a
`PRESETS` dict or a `get_config()`): no gin, no strings evaluated.

The examples ship inside the package (`dpsynth/configs/`, found with `importlib.resources`),
so a wheel install has them too and a bare name works from any folder: `--config demo` is the
packaged `demo.py` (`resolve_pipeline_config`), `synthgen pipeline init demo` copies it to
edit (`copy_pipeline_example`), and a query-generator preset name is an entry of the packaged
`querygen.py` (`querygen_preset`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.resources
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synthgen.querygen_config import GeneratorConfig

CONFIGS_PACKAGE = "dpsynth.configs"
QUERYGEN_FILE = "querygen.py"
PIPELINE_ENTRY = "get_config"  # a pipeline config file defines get_config() -> PipelineConfig


class UnknownConfigError(ValueError):
    """A bare config name that is neither a file nor a packaged example (a usage error)."""


def default_configs_dir() -> Path:
    """The packaged example configs' folder, `dpsynth/configs/` (inside the installed package).

    Raises:
      ValueError: the package is not on the file system (a zipped install), so its files
        cannot be loaded by path; pass a config file's path instead.
    """
    directory = importlib.resources.files(CONFIGS_PACKAGE)
    if not isinstance(directory, Path) or not directory.is_dir():
        raise ValueError(
            f"the packaged configs ({CONFIGS_PACKAGE}) are not a folder on disk; "
            "pass the path of a config file instead"
        )
    return directory


def pipeline_examples() -> list[str]:
    """The names of the packaged pipeline configs (e.g. demo, gpu, tiny), sorted.

    A packaged file counts if it defines `get_config` at top level; the files are parsed,
    not run, so listing them imports nothing.
    """
    names = []
    for path in sorted(default_configs_dir().glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if any(
            isinstance(node, ast.FunctionDef) and node.name == PIPELINE_ENTRY for node in tree.body
        ):
            names.append(path.stem)
    return names


def _is_bare_name(spec: str) -> bool:
    separators = [os.sep] + ([os.altsep] if os.altsep else [])
    return (
        not spec.endswith(".py")
        and not any(sep in spec for sep in separators)
        and not Path(spec).expanduser().is_file()
    )


def resolve_pipeline_config(spec: str | Path) -> Path:
    """The file a pipeline `--config` names: a path, or a packaged example's name.

    A bare name (no `.py`, no path separator, and no file of that name in the current
    folder) is a packaged example: `demo` is `dpsynth/configs/demo.py`, from any folder
    and in any install. Anything else is a path, relative to the current folder.

    Args:
      spec: `path/to/file.py`, or a name of `pipeline_examples()`.

    Returns:
      The config file's path (not checked to define `get_config`; loading does that).

    Raises:
      UnknownConfigError: a bare name that is no packaged example (the message lists them).
      FileNotFoundError: a path with no file (the message lists the packaged examples).
    """
    text = str(spec)
    if _is_bare_name(text):
        examples = pipeline_examples()
        if text not in examples:
            raise UnknownConfigError(
                f"unknown config {text!r}: no such file and no packaged example of that "
                f"name; packaged examples: {', '.join(examples)} (or a path to a .py file)"
            )
        return default_configs_dir() / f"{text}.py"
    path = Path(text).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"no config file at {text}; packaged examples, by name: "
            f"{', '.join(pipeline_examples())}"
        )
    return path


def copy_pipeline_example(name: str, to: str | Path | None = None, *, force: bool = False) -> Path:
    """Copies the packaged pipeline example `name` to a file the user can edit.

    Args:
      name: a name of `pipeline_examples()`.
      to: the destination file, or an existing folder to put `NAME.py` in; default
        `./NAME.py`.
      force: overwrite an existing destination file.

    Returns:
      The destination path.

    Raises:
      UnknownConfigError: `name` is no packaged example (the message lists them).
      ValueError: the destination exists and `force` is not set.
    """
    examples = pipeline_examples()
    if name not in examples:
        raise UnknownConfigError(
            f"no packaged example {name!r}; packaged examples: {', '.join(examples)}"
        )
    destination = Path(to).expanduser() if to is not None else Path(f"{name}.py")
    if destination.is_dir():
        destination = destination / f"{name}.py"
    if destination.exists() and not force:
        raise ValueError(f"{destination} exists; pass --force to overwrite it")
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(default_configs_dir() / f"{name}.py", destination)
    return destination


def load_config_module(path: str | Path) -> ModuleType:
    """Imports the Python config file at `path` and returns it as a module.

    Each resolved path gets its own module name (`dpsynth_config_<stem>_<hash>`), so two
    files with the same name do not shadow each other. The file is executed on every call,
    so an edited file is read anew.

    Args:
      path: a `.py` file.

    Returns:
      The imported module (also registered in `sys.modules` under its name, as dataclasses
      and pickle expect).

    Raises:
      FileNotFoundError: no such file.
      ValueError: the path is not a `.py` file.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    if resolved.suffix != ".py":
        raise ValueError(f"a config file is a Python file (.py), got {path}")
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in resolved.stem)
    name = f"dpsynth_config_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import the config file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def querygen_preset(spec: str) -> GeneratorConfig:
    """The query-generator config named by `spec`.

    Args:
      spec: a preset name of the packaged `dpsynth/configs/querygen.py` (e.g. "tiny_t5"), or
        "path/to/file.py:NAME" for the entry NAME of that file's `PRESETS` dict.

    Returns:
      The `GeneratorConfig`.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: unknown preset (the message lists the file's presets), a file without a
        `PRESETS` dict, or an entry that is not a `GeneratorConfig`.
    """
    from synthgen.querygen_config import GeneratorConfig

    if ":" in spec:
        path_text, name = spec.rsplit(":", 1)
        if not path_text or not name:
            raise ValueError(f"expected a preset NAME or path/to/file.py:NAME, got {spec!r}")
        path = Path(path_text)
    else:
        path, name = default_configs_dir() / QUERYGEN_FILE, spec
    presets = getattr(load_config_module(path), "PRESETS", None)
    if not isinstance(presets, dict):
        raise ValueError(f"{path} defines no PRESETS dict")
    if name not in presets:
        raise ValueError(f"unknown preset {name!r} in {path}; presets: {', '.join(presets)}")
    config = presets[name]
    if not isinstance(config, GeneratorConfig):
        raise ValueError(
            f"{path}: PRESETS[{name!r}] is a {type(config).__name__}, not a GeneratorConfig"
        )
    return config
