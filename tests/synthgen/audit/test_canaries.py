"""Canaries: the four kinds, inclusion with probability 1/2, insertions and the private record."""

import numpy as np
import pytest
import scipy.stats

from synthgen.audit import canaries

DOCS = [f"public document number {i} about rivers mountains and valleys" for i in range(30)]


def test_cells_kinds_and_secrets():
    spec = canaries.CanarySpec(
        kinds=("secret", "real_document", "random_document"),
        repetitions=(1, 10),
        per_cell={1: 5, 10: 2},
    )
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(0))
    assert len(drawn) == 3 * 5 + 3 * 2
    assert [c.id for c in drawn] == list(range(len(drawn)))
    for c in drawn:
        assert len(c.secret) == 10 and c.secret.isdigit()
        assert c.query == f"{c.key} {c.secret}" and len(c.key.split()) == spec.key_words
        if c.kind == "secret":
            assert c.document == ""
        elif c.kind == "real_document":
            assert c.document in DOCS
        else:
            assert c.document not in DOCS and len(c.document.split()) == spec.document_words
    assert len({c.secret for c in drawn}) == len(drawn)


def test_each_canary_is_included_with_probability_one_half():
    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1,), per_cell=2000)
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(1))
    inside = sum(c.included for c in drawn)
    assert scipy.stats.binomtest(inside, len(drawn), 0.5).pvalue > 1e-3


def test_insertions_repeat_only_included_canaries():
    spec = canaries.CanarySpec(kinds=("secret", "random_document"), repetitions=(1, 3, 7))
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(2))
    documents, queries = canaries.insertions(drawn)
    assert len(documents) == len(queries) == sum(c.repetitions for c in drawn if c.included)
    for c in drawn:
        assert queries.count(c.query) == (c.repetitions if c.included else 0)


class _WordTokenizer:
    """Whole words are single tokens; `decode` joins with spaces."""

    eos_id, pad_id, bos_id = 0, 1, None

    def __init__(self, words):
        self.words = ["<eos>", "<pad>", *words]

    def encode(self, text):
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_rare_token_pool_takes_the_least_likely_clean_words():
    tok = _WordTokenizer(["a", "alpha", "beta", "gamma", "x1", "delta", "zeta"])
    log_probs = np.array([-50.0, -60.0, -1.0, -9.0, -8.0, -2.0, -30.0, -7.0, -3.0])
    pool = canaries.rare_token_pool(tok, log_probs, 3)
    # eos and pad are skipped and "x1" is not a word: the 3 least likely words remain
    assert [tok.words[i] for i in pool] == ["alpha", "beta", "delta"]
    spec = canaries.CanarySpec(kinds=("rare_token",), repetitions=(1,), per_cell=4)
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(3))
    drawn = canaries.with_rare_secrets(drawn, np.random.default_rng(4), tok, pool)
    for c in drawn:
        words = c.secret.split()
        assert len(words) == 10 and set(words) <= {"alpha", "beta", "delta"}
    assert canaries.space_size(drawn[0], len(pool)) == 3.0**10
    with pytest.raises(ValueError, match="pool"):
        canaries.with_rare_secrets(drawn, np.random.default_rng(4), tok, pool[:1])


def test_record_round_trip_in_the_work_folder(tmp_path):
    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1,), per_cell=3)
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(5))
    canaries.save_record(drawn, tmp_path / "work", references=[["1"], ["2"], ["3"]])
    again, extra = canaries.load_record(tmp_path / "work")
    assert again == drawn and extra == {"references": [["1"], ["2"], ["3"]]}


def test_bad_specs_are_refused():
    with pytest.raises(ValueError):
        canaries.CanarySpec(kinds=("nope",))
    with pytest.raises(ValueError):
        canaries.CanarySpec(repetitions=(0,))
    with pytest.raises(ValueError):
        canaries.CanarySpec(repetitions=(1, 10), per_cell={1: 4})


def test_group_claims_follow_group_privacy():
    import math

    from synthgen.audit.claims import group_claim, parse_epsilons

    assert group_claim(2.0, 1e-5, 1) == (2.0, 1e-5)
    eps, delta = group_claim(0.1, 1e-6, 10)
    assert eps == pytest.approx(1.0) and delta == pytest.approx(10 * math.exp(0.9) * 1e-6)
    assert group_claim(3.0, 1e-3, 10)[0] == math.inf  # r e^{(r-1)eps} delta >= 1: vacuous
    assert group_claim(math.inf, 1e-3, 100)[0] == math.inf
    assert parse_epsilons("inf, 16,8,3") == (math.inf, 16.0, 8.0, 3.0)
    with pytest.raises(ValueError):
        parse_epsilons("0")


def test_split_by_repetitions_and_private_record_folder(tmp_path):
    import stat

    spec = canaries.CanarySpec(kinds=("secret",), repetitions=(1, 5), per_cell=6)
    drawn = canaries.make_canaries(spec, DOCS, np.random.default_rng(6))
    scores = [float(c.id) for c in drawn]
    groups = canaries.split_by_repetitions(drawn, scores)
    assert list(groups) == [1, 5]
    for reps, (inside, outside) in groups.items():
        cell = [c for c in drawn if c.repetitions == reps]
        assert inside == [float(c.id) for c in cell if c.included]
        assert outside == [float(c.id) for c in cell if not c.included]
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    canaries.save_record(drawn, work)
    assert stat.S_IMODE(work.stat().st_mode) == 0o700  # tightened, not only on creation
