"""`synthgen pipeline --config NAME` and `synthgen pipeline init`: the packaged examples by
name, from any folder; usage errors are one line with exit code 2."""

import pytest

from dpsynth.cli.synthgen import app, run
from dpsynth.config_files import default_configs_dir


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder that is not the checkout."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(capsys, *args):
    code = run(app, ["pipeline", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_config_by_name_from_another_folder(elsewhere, capsys):
    code, out, err = _run(capsys, "status", "--config", "tiny", "--out", "run")
    assert code == 0, err
    assert out.splitlines()[0] == "data      missing"


def test_unknown_name_is_one_usage_line_listing_the_examples(elsewhere, capsys):
    code, _, err = _run(capsys, "status", "--config", "nope")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "unknown config 'nope'" in err and "packaged examples: demo, gpu, tiny" in err
    code, _, err = _run(capsys, "status")  # no --config: the names too
    assert code == 2 and "--config NAME (demo, gpu, tiny)" in err


def test_init_copies_an_example_and_says_what_to_run(elsewhere, capsys):
    code, out, err = _run(capsys, "init", "tiny")
    assert code == 0, err
    copy = elsewhere / "tiny.py"
    assert copy.read_text() == (default_configs_dir() / "tiny.py").read_text()
    assert out.splitlines() == ["wrote tiny.py", "next: synthgen pipeline --config tiny.py"]
    code, out, err = _run(capsys, "status", "--config", "tiny.py", "--out", "run")
    assert code == 0 and "note:" not in err
    # The bare name is still the packaged example: said once on stderr.
    code, out, err = _run(capsys, "status", "--config", "tiny", "--out", "run")
    assert code == 0 and "your ./tiny.py is --config tiny.py" in err


def test_init_refuses_to_overwrite_without_force(elsewhere, capsys):
    (elsewhere / "demo.py").write_text("# mine\n")
    code, _, err = _run(capsys, "init", "demo")
    assert code == 1 and "demo.py exists; pass --force" in err
    assert len(err.strip().splitlines()) == 1
    assert (elsewhere / "demo.py").read_text() == "# mine\n"
    code, out, _ = _run(capsys, "init", "demo", "--force")
    assert code == 0 and (elsewhere / "demo.py").read_text().startswith('"""`make demo`')


def test_init_to_a_path_and_an_unknown_name(elsewhere, capsys):
    code, out, _ = _run(capsys, "init", "gpu", "--to", "configs/mine.py")
    assert code == 0 and (elsewhere / "configs" / "mine.py").is_file()
    assert "next: synthgen pipeline --config configs/mine.py" in out
    code, _, err = _run(capsys, "init", "nope")
    assert code == 2 and "packaged examples: demo, gpu, tiny" in err
    assert not (elsewhere / "nope.py").exists()
