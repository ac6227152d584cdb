"""The DP partition selection on Apache Beam's DirectRunner: the same released set as the
local backend, each record cut to max_keys inside the pipeline, and the fact release through
it (`FactConfig(backend="beam")`, `retriever knowledge release --backend beam`).

Each comparison is made where the noise is far from the threshold: a key held by many
records is at least 8 noise standard deviations above it (missed with probability below
Phi(-8) = 7e-16 per key), and a key held by one record is released with probability
`keep_probability(1)` (delta / 2K), which the smaller delta here makes about 1e-11 per key.
Each test states its failure probability by the union bound.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections import Counter

import pytest

from dpsynth.evaluation.fact_world import make_world, write_world
from dpsynth.evaluation.natural_world import make_natural_world
from synthgen.knowledge.facts import CHARGE_FILE, FactConfig, release_facts
from synthgen.knowledge.typed_facts import record_fact_keys, split_fact
from synthgen.privacy import PrivacyLedger, Scope, partition_selection
from synthgen.privacy.partition_selection import (
    keep_probability,
    noise_stddev,
    release_key_counts,
    selection_threshold,
)
from synthgen.privacy.receipts import ledger_payer
from tests.dpsynth.service.harness import cli

DELTA = 1e-10  # a key of one record: released with probability delta / 2K per key


def _released_folders(monkeypatch) -> list[tuple[str, int]]:
    """Records each private folder the Beam backend makes, with its mode at creation."""
    made = []
    real = partition_selection.tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        path = real(*args, **kwargs)
        if os.path.basename(path).startswith("dpsynth-release-"):  # not Beam's own folders
            made.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        return path

    monkeypatch.setattr(partition_selection.tempfile, "mkdtemp", mkdtemp)
    return made


def test_beam_and_local_release_the_keys_many_records_hold_and_no_singleton(monkeypatch):
    """200 records hold two shared keys (17 sigma above the threshold), 300 records hold
    two keys of their own. Failure probability: 600 singletons x 2 backends x 2.5e-11 =
    3e-8, plus 4 x Phi(-17) for the shared keys."""
    epsilon, max_keys = 1.0, 2
    sigma = noise_stddev(epsilon, DELTA, max_keys)
    assert 200 - selection_threshold(epsilon, DELTA, max_keys) > 16 * sigma
    assert keep_probability(1, epsilon, DELTA, max_keys) < 3e-11
    units = [["shared-a", "shared-b"] for _ in range(200)]
    units += [[f"own-{i}-a", f"own-{i}-b"] for i in range(300)]
    made = _released_folders(monkeypatch)
    kwargs = {"epsilon": epsilon, "delta": DELTA, "max_keys": max_keys}
    beam = release_key_counts(units, backend="beam", **kwargs)
    local = release_key_counts(units, backend="local", **kwargs)
    assert set(beam.counts) == set(local.counts) == {"shared-a", "shared-b"}
    for release in (beam, local):
        assert all(abs(c - 200) < 8 * sigma for c in release.counts.values())
        assert list(release.counts.values()) == sorted(release.counts.values(), reverse=True)
    assert beam.to_dict() == local.to_dict()  # the same mechanism, parameters and sensitivity
    # the released keys came back through a private folder (0700), deleted once read
    assert len(made) == 1 and made[0][1] == 0o700 and not os.path.exists(made[0][0])


def test_the_pipeline_cuts_each_record_to_max_keys_distinct_keys():
    """Each record states 'alpha' three times and then eight more words; with max_keys = 3
    it counts alpha once and its next two distinct words only, so alpha is held by 300
    records (not 900) and the later words by none. Tolerance 8 sigma (sigma about 10 here;
    a count of 900, or a released later word, is 58 sigma away); failure probability below
    3 x Phi(-8) = 2e-15."""
    epsilon, max_keys = 1.0, 3
    sigma = noise_stddev(epsilon, DELTA, max_keys)
    records = ["alpha alpha alpha beta gamma delta eta theta iota kappa lambda"] * 300
    out = release_key_counts(
        records,
        epsilon=epsilon,
        delta=DELTA,
        max_keys=max_keys,
        extract=str.split,
        backend="beam",
        beam_options=["--runner=DirectRunner"],
    )
    assert set(out.counts) == {"alpha", "beta", "gamma"}
    assert all(abs(c - 300) < 8 * sigma for c in out.counts.values()), out.counts
    assert out.max_keys == max_keys and out.to_dict()["l2_sensitivity"] == 3**0.5


def test_a_temp_location_holds_the_result_only_while_it_is_read(tmp_path):
    """With --temp_location (a cluster's shared filesystem) the result folder is made there
    and deleted after reading. Failure probability: 2 x Phi(-17)."""
    remote = tmp_path / "remote"
    remote.mkdir()
    out = release_key_counts(
        [["a", "b"]] * 200,
        epsilon=1.0,
        delta=DELTA,
        max_keys=2,
        backend="beam",
        beam_options=[f"--temp_location={remote}"],
    )
    assert set(out.counts) == {"a", "b"} and list(remote.iterdir()) == []


def test_a_fact_release_on_beam_releases_what_the_local_one_does():
    """A natural helpdesk world (429 records, typed facts, K = 1) released on both
    backends: every fact at least 8 sigma above the threshold (9 or more records) is in
    both, with counts within 8 sigma of the truth, and no fact of one record is in either.
    Failure probability: 2 x 22 singletons x 5e-11 = 2.2e-9, plus 40 x Phi(-8)."""
    texts = make_natural_world("helpdesk", seed=0).documents
    held = Counter(k for text in texts for k in set(record_fact_keys(text, 1)))
    local = release_facts(texts, FactConfig(epsilon=10.0, delta=DELTA))
    beam = release_facts(texts, FactConfig(epsilon=10.0, delta=DELTA, backend="beam"))
    plan = local.plan
    assert plan.to_dict() == beam.plan.to_dict()  # the backend is not a privacy parameter
    sigma = plan.noise_stddev
    frequent = {k for k, n in held.items() if n > plan.threshold + 8 * sigma}
    singletons = {k for k, n in held.items() if n == 1}
    assert len(frequent) >= 5 and len(singletons) >= 10
    for release in (local, beam):
        assert frequent <= set(release.pairs) <= set(held)
        assert not singletons & set(release.pairs)
        assert all(abs(release.pairs[k] - held[k]) < 8 * sigma for k in frequent)
        assert {r["topic"] for r in release.records} >= {split_fact(k)[0] for k in frequent}


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        release_key_counts([["a"]], epsilon=1.0, delta=1e-6, max_keys=1, backend="spark")
    with pytest.raises(ValueError, match="backend"):
        FactConfig(epsilon=1.0, backend="spark")
    with pytest.raises(ValueError, match="beam_options"):
        release_key_counts([["a"]], epsilon=1.0, delta=1e-6, max_keys=1, beam_options=[])
    with pytest.raises(ValueError, match="beam_options"):
        FactConfig(epsilon=1.0, beam_options=("--runner=DirectRunner",))


def test_without_apache_beam_the_error_names_the_extra_and_nothing_is_charged(
    monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails
    with pytest.raises(ImportError, match=r"pip install 'dpsynth\[beam\]'"):
        release_key_counts([["a"]], epsilon=1.0, delta=1e-6, max_keys=1, backend="beam")
    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    ledger.ensure_scope(Scope("release", "c", 10.0, 1e-6))
    texts = make_natural_world("helpdesk", seed=0).documents
    with pytest.raises(ImportError, match=r"dpsynth\[beam\]"):
        release_facts(
            texts, FactConfig(epsilon=10.0, backend="beam"), work=tmp_path / "work",
            pay=ledger_payer(ledger, ("release", "c"), stage="knowledge-release"),
        )  # fmt: skip
    assert ledger.charges("release", "c") == []
    assert not (tmp_path / "work" / CHARGE_FILE).exists()


@pytest.mark.slow
def test_the_cli_releases_on_beam(tmp_path):
    """`retriever knowledge release --backend beam`: charged once, the two facts stated by
    50 records released (33 and 48 records yield them: more than 50 sigma above the
    threshold), and neither fact stated by one record (each at most 5e-7, the card's
    figure: 1e-6 together)."""
    world = make_world("products", facts_per_level=2, seed=5)
    write_world(world, tmp_path / "world")
    corpus = tmp_path / "world" / "corpus.jsonl"
    result = cli("knowledge", "release", "--private-corpus", corpus, "--out", tmp_path / "rel",
                 "--epsilon", 10, "--ledger", tmp_path / "ledger.sqlite", "--work",
                 tmp_path / "work", "--backend", "beam", "--json")  # fmt: skip
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["complete"] and line["pairs"] > 0
    charges = PrivacyLedger(str(tmp_path / "ledger.sqlite")).charges("release", "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]
    released = (tmp_path / "rel" / "synthetic.jsonl").read_text()
    assert all(f.value in released for f in world.facts if f.support == 50)
    assert not any(f.value in released for f in world.facts if f.support == 1)


QUIET_CHECK = """
import logging, sys
from synthgen.privacy.partition_selection import _beam_import_quiet
root = logging.getLogger()
with _beam_import_quiet():  # on a root without handlers: what Beam's import meets
    logging.warning("apitools not found, and bigquery client libraries ...")
assert root.handlers == [] and root.filters == [], (root.handlers, root.filters)
logging.basicConfig(stream=sys.stdout, format="%(message)s")
mine = list(root.handlers)
with _beam_import_quiet():
    logging.warning("apitools not found, again")
    logging.warning("another warning %s", "passes")
assert root.handlers == mine and root.filters == []
try:
    with _beam_import_quiet():
        raise KeyError("inside")
except KeyError:
    pass
assert root.handlers == mine and root.filters == []
"""


def test_the_quiet_import_hides_that_one_warning_and_keeps_the_callers_logging():
    """`_beam_import_quiet` in a fresh process: Beam's warning is dropped and the
    basicConfig its call makes on a bare root is undone; a handler the caller set up stays,
    another warning still reaches it, and no filter is left behind, even on an error."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", QUIET_CHECK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "another warning passes\n", done.stdout
    assert done.stderr == "", done.stderr


def test_importing_pipeline_dp_prints_nothing_and_configures_no_logging():
    """Apache Beam warns at import that its BigQuery clients are missing, through the root
    logger, which configures it: a fresh process that calibrates a threshold prints nothing
    and leaves the root logger as it was (no handler)."""
    import subprocess

    code = (
        "import logging\n"
        "from synthgen.privacy.partition_selection import selection_threshold\n"
        "assert selection_threshold(1.0, 1e-6, 1) > 1\n"
        "import sys\n"
        "assert 'apache_beam' in sys.modules\n"  # pipeline_dp imported it, quietly
        "print(len(logging.getLogger().handlers))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # before: the "apitools not found" line
    assert done.stdout.strip() == "0"
