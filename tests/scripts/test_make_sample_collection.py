"""The main job's packaged sample collections are what `scripts/make_sample_collection.py`
writes from the fictional medical worlds today: the data cannot drift from its generator."""

import importlib.util
import sys
from pathlib import Path

import pytest

from dpsynth.pipeline.sample_collections import FOLDER, SAMPLES, sample_files

ROOT = Path(__file__).parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_sample_collection", ROOT / "scripts" / "make_sample_collection.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_packaged_sample_is_what_the_script_writes(tmp_path, name):
    written = _script().write_sample(name, tmp_path)
    assert written == tuple(tmp_path / p.name for p in sample_files(name))
    for packaged, fresh in zip(sample_files(name), written):
        assert packaged.read_bytes() == fresh.read_bytes(), packaged.name


def test_the_folder_holds_the_registered_samples_only():
    files = {p.name for p in FOLDER.glob("*.jsonl")}
    assert files == {p.name for name in SAMPLES for p in sample_files(name)}


def test_the_packaged_files_read_as_a_corpus_and_questions():
    from dpsynth.pipeline.rag_stage import read_questions
    from retriever.data import read_corpus

    for name, sample in SAMPLES.items():
        corpus, questions = sample_files(name)
        doc_ids, _ = read_corpus(corpus)
        assert len(doc_ids) == sample.records and doc_ids[-1] == f"rec-{sample.records - 1:05d}"
        assert len(read_questions(questions)) == sample.diseases  # one per disease
