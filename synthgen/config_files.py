"""Config files loaded by path: the repository's `configs/` folder and the user's own files.

`configs/` is a folder of Python config files, not an installed package (as in t5x and the
flax examples, where `--config path/to/file.py` names a file): each file defines frozen
dataclass presets and is imported from its path with `importlib`, so a user can copy one,
change it and pass the copy without installing anything. The files are ordinary modules
(dataclass instances, a `PRESETS` dict or a `get_config()`): no gin, no strings evaluated.

`default_configs_dir()` is the `configs/` folder beside the `synthgen` package, which exists
in a source checkout and an editable install (`pip install -e .`); elsewhere pass a path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synthgen.querygen import GeneratorConfig

QUERYGEN_FILE = "querygen.py"


def default_configs_dir() -> Path:
    """The repository's `configs/` folder, next to the `synthgen` package.

    Raises:
      ValueError: the folder does not exist (e.g. a non-editable install, which ships no
        config files); pass a config file's path instead.
    """
    import synthgen

    directory = Path(synthgen.__file__).resolve().parents[1] / "configs"
    if not directory.is_dir():
        raise ValueError(
            f"no configs folder at {directory}: the preset files ship with the source "
            "checkout (pip install -e .); pass the path of a config file instead"
        )
    return directory


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
      spec: a preset name of `configs/querygen.py` (e.g. "tiny_t5"), or
        "path/to/file.py:NAME" for the entry NAME of that file's `PRESETS` dict.

    Returns:
      The `GeneratorConfig`.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: unknown preset (the message lists the file's presets), a file without a
        `PRESETS` dict, an entry that is not a `GeneratorConfig`, or no configs folder to
        look a bare name up in.
    """
    from synthgen.querygen import GeneratorConfig

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
