"""synthgen.audit.cells: a cell file made with other settings is refused, not reused."""

import dataclasses
import json
import math

import pytest

from synthgen.audit.cells import read_back, stale_settings


@dataclasses.dataclass(frozen=True)
class _Result:
    model: str
    epochs: float
    kind: str
    learning_rate: float

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


STORED = dict(model="smollm2 (LoRA 8)", epochs=1.0, kind="new", learning_rate=3e-3)


def test_same_settings_read_back(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(STORED))
    expect = dict(epochs=1, kind="new", learning_rate=None, model="reworded", embed=print)
    assert read_back(path, _Result, expect) == _Result(**STORED)
    assert stale_settings(STORED, dict(epochs=1.0 + 1e-12, unrecorded=5)) == []


def test_other_settings_are_refused(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(STORED))
    with pytest.raises(ValueError, match=r"cell.json was made with other settings"):
        read_back(path, _Result, dict(epochs=3.0))
    assert stale_settings(STORED, dict(epochs=3.0, kind="rare", learning_rate=1e-2)) == [
        "epochs: file 1.0 != asked 3.0",
        "kind: file 'new' != asked 'rare'",
        "learning_rate: file 0.003 != asked 0.01",
    ]
    assert stale_settings(dict(flag=False), dict(flag=True)) == ["flag: file False != asked True"]
    assert stale_settings(dict(eps=math.inf), dict(eps=math.inf)) == []
