"""`synthgen.privacy.notices`: which ledger holds a charge, and weak-guarantee warnings
(privacy review, issue 68, findings 12 and 15)."""

import math

import pytest

from synthgen.privacy import PrivacyLedger
from synthgen.privacy.notices import (
    announce_ledger,
    guarantee_lines,
    ledger_lines,
    new_ledger_warning,
    warn_weak_guarantee,
)


def test_a_new_ledger_file_is_named_and_warned_about_once(tmp_path):
    path = tmp_path / "other" / "ledger.sqlite"
    first = ledger_lines(PrivacyLedger(path), "notes")
    assert first[0] == f"ledger: collection notes is charged in {path.resolve()}"
    assert len(first) == 2 and first[1].startswith(f"warning: created a new ledger at {path}")
    assert "collection notes starts with a full budget here" in first[1]
    assert "charges in other ledgers are not counted" in first[1]
    assert first[1].endswith("(pass --ledger OLD to keep one budget)")
    # opened again (the next command): the same location, no warning
    assert ledger_lines(PrivacyLedger(path), "notes") == first[:1]
    assert new_ledger_warning(PrivacyLedger(path), "notes") is None


def test_a_command_without_a_ledger_option_names_none(tmp_path):
    warning = new_ledger_warning(PrivacyLedger(tmp_path / "l.sqlite"), "pairs", option=None)
    assert warning.endswith("charges in other ledgers are not counted")


def test_announce_ledger_prints_on_stderr_only(tmp_path, capsys):
    announce_ledger(PrivacyLedger(tmp_path / "l.sqlite"), "notes")
    out, err = capsys.readouterr()
    assert out == "" and "ledger: collection notes is charged in" in err
    assert "warning: created a new ledger" in err


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 8.0, 10.0, math.inf, None])
def test_an_ordinary_epsilon_is_not_warned_about(epsilon):
    assert guarantee_lines(epsilon, 1e-6, 1000) == []


@pytest.mark.parametrize("epsilon", [10.5, 20.0, 1000.0])
def test_an_epsilon_above_10_is_warned_about(epsilon):
    [line] = guarantee_lines(epsilon, 1e-6, 1000)
    assert line.startswith(f"warning: epsilon={epsilon:g} is above 10: the guarantee is weak")
    assert "e^epsilon" in line


def test_delta_near_one_over_n_is_warned_about_and_a_tenth_of_it_is_not():
    n = 1000
    assert guarantee_lines(1.0, 1e-6, n) == []
    assert guarantee_lines(1.0, 1.0 / (10 * n), n) == []  # the few-shot and PE default
    assert guarantee_lines(1.0, 0.1 / n, n) == []  # the same bound written another way
    [line] = guarantee_lines(1.0, 1.0 / (2 * n), n)  # DP-SGD's default 1/(2n)
    assert line.startswith("warning: delta=0.0005 is near 1/n (n=1000)")
    assert "publish each record outright with probability delta" in line
    assert "n*delta = 0.5 records" in line and "<= 1/(10 n) = 0.0001" in line


def test_both_warnings_name_the_guarantee_they_are_about():
    lines = guarantee_lines(12.0, 0.01, 20, what="per answer")
    assert [line.split(" is ")[0] for line in lines] == [
        "warning: epsilon=12 (per answer)",
        "warning: delta=0.01 (per answer)",
    ]


def test_warn_weak_guarantee_prints_nothing_for_a_sound_setting(capsys):
    warn_weak_guarantee(4.0, 1e-7, 500)
    assert capsys.readouterr().err == ""
    warn_weak_guarantee(40.0, 1e-3, 500)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("warning: ") for line in err)
