"""The main job's packaged sample collections: fictional medical records and their questions.

Without `rag.records`, the DP-RAG stage answers over one of these (`rag.sample`). Each sample
is two data files in this folder, shipped as package data:

* ``NAME.corpus.jsonl``: the private records, ``{"doc_id", "text"}`` per line
  (`retriever.data.read_corpus`);
* ``NAME.questions.jsonl``: the public questions, ``{"question", "answer"}`` per line
  (`dpsynth.pipeline.rag_stage.read_questions`), one per disease in the world's public
  disease order (never ordered by the private records).

They were written once by ``python scripts/make_sample_collection.py`` from the DP-RAG
evaluation's fictional medical world (`dpsynth.evaluation.medical_world`: invented diseases,
so no pretrained LM knows the answers) of the sizes in `SAMPLES`; the main job reads the
files and never builds a world. ``tests/scripts/test_make_sample_collection.py`` checks that
the files are what the script writes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

FOLDER = Path(__file__).resolve().parent  # package data: an installed package's folder


@dataclasses.dataclass(frozen=True)
class Sample:
    """A packaged sample: the medical world it was made from (its sizes and seed)."""

    records: int
    diseases: int
    seed: int = 0


SAMPLES = {
    "medical-40": Sample(records=40, diseases=5),  # the tiny preset's
    "medical-200": Sample(records=200, diseases=10),  # the demo preset's, the default
    "medical-2000": Sample(records=2000, diseases=40),  # the gpu preset's
}
DEFAULT_SAMPLE = "medical-200"


def check_sample(name: str) -> Sample:
    """The packaged sample `name`.

    Raises:
      ValueError: no packaged sample of that name (the message lists them).
    """
    if name not in SAMPLES:
        raise ValueError(
            f"rag.sample must be a packaged sample collection ({', '.join(SAMPLES)}), got "
            f"{name!r}; a collection of your own is rag.records and rag.questions_file"
        )
    return SAMPLES[name]


def sample_files(name: str) -> tuple[Path, Path]:
    """The (corpus, questions) files of the packaged sample `name` (ValueError: no such
    sample)."""
    check_sample(name)
    return FOLDER / f"{name}.corpus.jsonl", FOLDER / f"{name}.questions.jsonl"


def fingerprint_fields(name: str) -> dict[str, int]:
    """What stands for the sample `name` in the rag stage's fingerprint: the world fields
    that `rag.sample` replaced (num_records, num_diseases, world_seed), with the values that
    made it, so a run folder made before keeps its fingerprint (its records, questions and
    order are the same)."""
    sample = check_sample(name)
    return {
        "num_records": sample.records,
        "num_diseases": sample.diseases,
        "world_seed": sample.seed,
    }
