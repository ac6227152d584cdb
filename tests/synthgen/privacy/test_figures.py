"""Stated figures are rounded up: a written epsilon or delta never reads below its figure."""

import math
import random

from retriever import provenance
from synthgen.privacy.figures import round_up


def test_round_up_never_reads_below_the_figure():
    rng = random.Random(0)
    for _ in range(20_000):
        value = 10 ** rng.uniform(-12, 6)
        for digits in (3, 4):
            shown = float(f"{round_up(value, digits):.{digits}g}")
            assert value <= shown <= value * (1 + 10 ** (1 - digits))
    assert round_up(7.962115, 4) == 7.963 and round_up(4.05186e-4, 3) == 4.06e-4
    assert round_up(9.9995, 4) == 10.0 and round_up(0.5, 4) == 0.5
    assert round_up(0.0, 4) == 0.0 and math.isinf(round_up(math.inf, 4))


def test_a_provenance_statement_states_its_figures_rounded_up():
    privacy = {"epsilon": 7.962115, "delta": 4.05186e-4, "unit": "one pair", "mechanism": "m"}
    assert "ε = 7.963, δ = 0.000406" in provenance.dp_sgd(privacy, num_pairs=4)["statement"]
