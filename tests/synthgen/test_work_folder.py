"""Private work folders are owner-only (mode 0700) at every level this code creates them
(privacy review, issue 68, finding 14)."""

import contextlib
import os
import stat

import pytest

from synthgen.paths import default_work_dir
from synthgen.work_folder import WorkFolder, private_folder


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_every_folder_created_is_0700_whatever_the_umask(tmp_path, mask):
    before = _mode(tmp_path)
    with _umask(mask):
        leaf = private_folder(tmp_path / "a" / "b" / "c")
    assert leaf == tmp_path / "a" / "b" / "c"
    for folder in (tmp_path / "a", tmp_path / "a" / "b", leaf):
        assert _mode(folder) == 0o700, folder
    assert _mode(tmp_path) == before  # a parent that existed is not ours to change


def test_an_existing_folder_is_tightened_and_its_parents_left_alone(tmp_path):
    (tmp_path / "shared" / "work").mkdir(parents=True)
    os.chmod(tmp_path / "shared", 0o755)
    os.chmod(tmp_path / "shared" / "work", 0o755)
    private_folder(tmp_path / "shared" / "work")
    assert _mode(tmp_path / "shared" / "work") == 0o700
    assert _mode(tmp_path / "shared") == 0o755


def test_a_file_in_the_way_is_an_error(tmp_path):
    (tmp_path / "a").write_text("x")
    with pytest.raises(OSError):
        private_folder(tmp_path / "a" / "b")


def test_a_new_training_work_folder_beside_the_ledger_is_0700_throughout(tmp_path):
    """`<ledger folder>/work/<release>-<hash>/checkpoints`: the default work folder of
    `synthgen train-generator` and `retriever train-dp`, as `dp_train` creates it."""
    work = WorkFolder(default_work_dir(tmp_path / "release", tmp_path / "l" / "ledger.sqlite"))
    with _umask(0o022):
        work.create()
    for folder in (work.path.parent, work.path, work.checkpoints):
        assert folder.is_dir() and _mode(folder) == 0o700, folder
