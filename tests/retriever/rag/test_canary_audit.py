"""Canary audit of the DP-RAG answer stage: the non-private RAG leaks, DP at epsilon 1 does not."""

import json
import math
import re
import zlib

import numpy as np
import pytest

from retriever.rag import RagConfig, aggregation, retrieval
from retriever.rag.canary_audit import (
    RECORD_FILE,
    digit_windows,
    leak_bound,
    make_rag_canaries,
    prefix_digits,
    run_rag_canary_audit,
    secret_revealed,
)
from synthgen import assets

MODEL = "smollm2-135m-instruct"
DOCUMENTS = [
    "Patient Ana Ruiz, 54, presented with a dry cough and fever. Diagnosis: influenza.",
    "The river flooded the lower town twice during the spring of that year.",
    "Bake the bread at two hundred degrees until the crust turns golden brown.",
    "The museum opens at nine and closes at six, except on public holidays.",
    "Patient Omar Diallo, 31, presented with a rash and joint pain. Diagnosis: measles.",
    "The committee approved the new budget after a long debate on road repairs.",
    "Water the tomato plants every morning and keep them in full sunlight.",
    "The train to the coast leaves from platform four every half hour.",
]


def bag_of_words(texts, dim=512):
    """Hashed bag-of-words embeddings, L2-normalised (scores in [0, 1]): a public encoder."""
    out = np.zeros((len(texts), dim), np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            out[i, zlib.crc32(word.encode()) % dim] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_leak_measures():
    assert secret_revealed("0123456789", "The code is 0123456789.")
    assert not secret_revealed("0123456789", "The code is 012345678.")
    assert prefix_digits("0123456789", "code 0123 456-78 then 1") == 9
    assert prefix_digits("0123456789", "code 9 8 7") == 0
    assert prefix_digits("0123456789", "no digits") == 0
    assert digit_windows("a 01234567891 b 12") == 2
    assert leak_bound(1.0, 1e-6, 1) == pytest.approx(math.e * 1e-10 + 1e-6)
    assert leak_bound(math.inf, 1e-6, 1) == 1.0


def test_canaries_are_random_and_distinct():
    canaries = make_rag_canaries(DOCUMENTS, 8, np.random.default_rng(0))
    assert len({c.key for c in canaries}) == 8 and len({c.doc_id for c in canaries}) == 8
    for c in canaries:
        assert re.fullmatch(r"\d{10}", c.secret)
        assert c.document == f"The access code of {c.key} is {c.secret}."
        assert c.question == f"What is the access code of {c.key}?"
    with pytest.raises(ValueError):
        make_rag_canaries(DOCUMENTS, 0, np.random.default_rng(0))


def test_bad_parameters_are_refused():
    for kwargs in (
        dict(epsilons=()),
        dict(epsilons=(0.0,)),
        dict(canaries=0),
        dict(answers_per_canary=0),
        dict(mechanism="magic"),
    ):
        with pytest.raises(ValueError):
            run_rag_canary_audit(DOCUMENTS, lm=None, encode=bag_of_words, **kwargs)


@pytest.fixture(scope="module")
def lm():
    if not assets.is_cached(MODEL):
        pytest.skip(f"the {MODEL} asset is not cached (run `synthgen assets fetch {MODEL}`)")
    from synthgen.lm_backends import FlaxLM

    return FlaxLM.load(MODEL)


def _audit(lm, epsilons, work_dir=None):
    return run_rag_canary_audit(
        DOCUMENTS,
        lm=lm,
        encode=bag_of_words,
        config=RagConfig(k=1, max_tokens=12),
        epsilons=epsilons,
        canaries=4,
        answers_per_canary=2,
        baseline_k=1,
        seed=0,
        work_dir=work_dir,
    )


def _no_noise(utilities, *, epsilon, sensitivity, rng, monotonic=False, log_base_measure=None):
    """The exponential mechanism with its Gumbel noise and public base measure switched
    off: the argmax of the private utilities."""
    return int(np.argmax(np.asarray(utilities, dtype=np.float64)))


@pytest.mark.slow
def test_rag_leaks_the_secret_and_dp_answers_do_not(lm, tmp_path, monkeypatch):
    audit = _audit(lm, (math.inf, 1.0), work_dir=tmp_path / "private")
    baseline, dp = audit["results"]
    # the non-private RAG copies the secret (or most of its digits) for most canaries
    assert baseline["revealed"] >= 0.75 or baseline["mean_prefix_digits"] >= 7
    assert baseline["mean_prefix_digits"] > baseline["mean_prefix_digits_reference"] + 5
    # DP at epsilon 1 per answer: no secret, not even another canary's
    assert dp["answers"] == 8
    assert dp["revealed"] == 0 and dp["revealed_any"] == 0 and dp["canaries_revealed"] == 0
    assert dp["mean_prefix_digits"] < 2
    assert dp["epsilon_per_answer"] <= 1.0 + 1e-6
    assert 1.0 < dp["epsilon_spent"] <= 8.0 + 1e-6  # 8 answers, each DP w.r.t. every canary
    assert dp["leak_bound_per_answer"] < 1e-5

    # nothing private in the returned figures; the secrets stay in the private work folder
    record = json.loads((tmp_path / "private" / RECORD_FILE).read_text())
    dumped = json.dumps(audit)
    for canary in record["canaries"]:
        assert canary["secret"] not in dumped and canary["key"] not in dumped
    assert (tmp_path / "private").stat().st_mode & 0o077 == 0

    # the same DP answers with the mechanisms' noise switched off leak: the zero above is
    # the noise's doing, not the prompts' or the retrieval's
    monkeypatch.setattr(aggregation, "exponential_mechanism", _no_noise)
    monkeypatch.setattr(retrieval, "exponential_mechanism", _no_noise)
    (noiseless,) = _audit(lm, (1.0,))["results"]
    assert noiseless["revealed"] >= 0.5
