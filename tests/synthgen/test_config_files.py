"""Config files loaded by path: `load_config_module`, `querygen_preset`, no `configs` package."""

import sys
import tomllib
from pathlib import Path

import pytest

from synthgen import config_files
from synthgen.dp_train import DPConfig
from synthgen.querygen import GeneratorConfig

REPO = Path(__file__).resolve().parents[2]

PRESET_FILE = """
from synthgen.dp_train import DPConfig
from synthgen.querygen import GeneratorConfig

PRESETS = {
    "mine": GeneratorConfig(
        family="t5", base="random:tiny", vocab_size=256, input_len=32, target_len=8,
        dp=DPConfig(batch_size=8, epochs=1, clip_norm=1.0, learning_rate=1e-2,
                    noise_multiplier=1.0, target_epsilon=None),
    ),
    "not_a_config": 3,
}
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_default_configs_dir_is_the_repository_folder():
    assert config_files.default_configs_dir() == REPO / "configs"


def test_load_config_module_gives_each_path_its_own_module(tmp_path):
    first = config_files.load_config_module(_write(tmp_path / "a" / "conf.py", "VALUE = 1\n"))
    second = config_files.load_config_module(_write(tmp_path / "b" / "conf.py", "VALUE = 2\n"))
    assert (first.VALUE, second.VALUE) == (1, 2)
    assert first.__name__ != second.__name__
    assert sys.modules[first.__name__] is first
    again = config_files.load_config_module(tmp_path / "a" / ".." / "a" / "conf.py")
    assert again.__name__ == first.__name__  # one name per resolved path


def test_load_config_module_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config file at"):
        config_files.load_config_module(tmp_path / "missing.py")
    with pytest.raises(ValueError, match=r"Python file \(\.py\)"):
        config_files.load_config_module(_write(tmp_path / "conf.yaml", "a: 1\n"))


def test_querygen_preset_by_name_is_the_repository_preset():
    config = config_files.querygen_preset("tiny_t5")
    assert isinstance(config, GeneratorConfig)
    assert (config.family, config.base, config.vocab_size) == ("t5", "random:tiny", 512)
    assert config_files.querygen_preset("tiny_llama").family == "llama"


def test_querygen_preset_from_a_file(tmp_path):
    path = _write(tmp_path / "my_presets.py", PRESET_FILE)
    config = config_files.querygen_preset(f"{path}:mine")
    assert (config.vocab_size, config.input_len) == (256, 32)
    assert isinstance(config.dp, DPConfig) and config.dp.noise_multiplier == 1.0


def test_querygen_preset_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown preset 'nope' .*presets: tiny_t5, tiny_llama"):
        config_files.querygen_preset("nope")
    path = _write(tmp_path / "my_presets.py", PRESET_FILE)
    with pytest.raises(ValueError, match=r"unknown preset 'tiny_t5' .*presets: mine"):
        config_files.querygen_preset(f"{path}:tiny_t5")
    with pytest.raises(ValueError, match="not a GeneratorConfig"):
        config_files.querygen_preset(f"{path}:not_a_config")
    with pytest.raises(FileNotFoundError, match="no config file at"):
        config_files.querygen_preset(f"{tmp_path / 'missing.py'}:mine")
    with pytest.raises(ValueError, match="defines no PRESETS"):
        empty = _write(tmp_path / "empty.py", "X = 1\n")
        config_files.querygen_preset(f"{empty}:mine")
    with pytest.raises(ValueError, match="expected a preset NAME"):
        config_files.querygen_preset(f"{path}:")


def test_default_configs_dir_missing_names_the_remedy(tmp_path, monkeypatch):
    import synthgen

    fake = tmp_path / "site-packages" / "synthgen" / "__init__.py"
    monkeypatch.setattr(synthgen, "__file__", str(fake))
    with pytest.raises(ValueError, match="pass the path of a config file"):
        config_files.default_configs_dir()


def test_the_distribution_installs_no_configs_package():
    # configs/ is a folder of files loaded by path, not a top-level module of the wheel.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [pattern for pattern in include if pattern.startswith("configs")]
    assert not (REPO / "configs" / "__init__.py").exists()
