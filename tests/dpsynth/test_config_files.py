"""Config files loaded by path: the packaged examples (by name, from any folder, in a wheel),
`load_config_module`, `querygen_preset` and `copy_pipeline_example`."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsynth import config_files
from dpsynth.config_files import UnknownConfigError
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


def test_the_examples_are_inside_the_package():
    packaged = REPO / "dpsynth" / "configs"
    assert config_files.default_configs_dir() == packaged
    assert config_files.pipeline_examples() == ["demo", "gpu", "tiny"]  # querygen.py is none
    assert (packaged / config_files.QUERYGEN_FILE).is_file()


def test_a_bare_name_is_the_packaged_example_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = config_files.default_configs_dir() / "tiny.py"
    assert config_files.resolve_pipeline_config("tiny") == packaged
    (tmp_path / "tiny").mkdir()  # a folder of that name is no config file: still the example
    assert config_files.resolve_pipeline_config("tiny") == packaged
    mine = _write(tmp_path / "tiny.py", "def get_config(): ...\n")
    assert config_files.resolve_pipeline_config("tiny.py") == Path("tiny.py")  # a path
    assert config_files.resolve_pipeline_config(mine) == mine
    assert config_files.resolve_pipeline_config("tiny") == packaged  # the name stays the name
    _write(tmp_path / "sub" / "demo", "def get_config(): ...\n")
    assert config_files.resolve_pipeline_config(f"sub{os.sep}demo") == Path("sub") / "demo"


def test_an_unknown_name_or_a_missing_path_lists_the_examples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownConfigError, match=r"unknown config 'nope'.*: demo, gpu, tiny"):
        config_files.resolve_pipeline_config("nope")
    assert issubclass(UnknownConfigError, ValueError)
    # The old checkout path, from another folder: the message names the examples.
    with pytest.raises(FileNotFoundError, match=r"configs/tiny.py; .*by name: demo, gpu, tiny"):
        config_files.resolve_pipeline_config("configs/tiny.py")
    with pytest.raises(FileNotFoundError, match="no config file at nope.py"):
        config_files.resolve_pipeline_config("nope.py")


def test_copy_pipeline_example_copies_and_refuses_to_overwrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (config_files.default_configs_dir() / "demo.py").read_text()
    assert config_files.copy_pipeline_example("demo") == Path("demo.py")
    assert (tmp_path / "demo.py").read_text() == source
    (tmp_path / "demo.py").write_text("# edited\n")
    with pytest.raises(ValueError, match=r"demo.py exists; pass --force"):
        config_files.copy_pipeline_example("demo")
    assert (tmp_path / "demo.py").read_text() == "# edited\n"  # untouched
    config_files.copy_pipeline_example("demo", force=True)
    assert (tmp_path / "demo.py").read_text() == source
    (tmp_path / "mine").mkdir()
    assert config_files.copy_pipeline_example("tiny", "mine") == Path("mine") / "tiny.py"
    new = config_files.copy_pipeline_example("gpu", tmp_path / "a" / "b.py")
    assert new == tmp_path / "a" / "b.py" and new.is_file()
    with pytest.raises(UnknownConfigError, match=r"no packaged example 'querygen'.*demo, gpu"):
        config_files.copy_pipeline_example("querygen")  # presets, not a pipeline config


def test_querygen_presets_load_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_files.querygen_preset("smollm2_lora_cpu").base == "smollm2-135m-instruct"


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


@pytest.mark.slow  # ~15 s: a build and a fresh interpreter that imports the pipeline
def test_a_built_distribution_ships_the_examples(tmp_path):
    """setuptools' build_py (the step that fills a wheel) copies the examples into the
    package, and a bare name then resolves and loads inside that build from another folder,
    as in a non-editable install. (No `pip wheel` here: the venv has no `wheel` package and
    the tests run offline; build_py is the part of bdist_wheel that selects the files.)"""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("synthgen", "retriever", "dpsynth"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    build = tmp_path / "build"
    built = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py"]
        + ["--build-lib", str(build)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    shipped = sorted(p.name for p in (build / "dpsynth" / "configs").glob("*.py"))
    assert shipped == ["__init__.py", "demo.py", "gpu.py", "querygen.py", "tiny.py"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = textwrap.dedent(
        """
        import dpsynth
        from dpsynth.config_files import querygen_preset, resolve_pipeline_config
        from dpsynth.pipeline import load_pipeline_config
        print(dpsynth.__file__)
        print(resolve_pipeline_config("tiny"))
        print(load_pipeline_config("demo").name, querygen_preset("tiny_t5").family)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(build)}  # before the editable install's finder
    loaded = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    lines = loaded.stdout.split("\n")
    assert lines[0] == str(build / "dpsynth" / "__init__.py")
    assert lines[1] == str(build / "dpsynth" / "configs" / "tiny.py")
    assert lines[2] == "demo t5"
