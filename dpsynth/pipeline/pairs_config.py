"""A main-job config for a user's own pairs file (`synthgen pipeline init --pairs FILE`).

`pairs_config_text` checks the pairs (and the collection) line by line
(`synthgen.user_pairs.read_pairs`: a bad file is refused here, before any config is written
or any budget spent) and writes a config file built on a packaged preset: the data section
reads the user's files, the DP generator keeps the preset's number of DP steps and expected
batch whatever the number of pairs (its epochs are set from the train pairs' count). The
DP-RAG stage answers the user's own questions over the user's private collection when both
are given (`rag_records`, `rag_questions`, checked here), and is turned off otherwise (the
preset's answers over its packaged sample collection, not the user's data); the report's
samples are off (a real query beside its synthetic one: the user's real queries are private).

Privacy:
  Reads the private pairs to check them and to count them; the config holds the files'
  paths, field names and public sizes (the pairs' count, as every DP plan of the main job
  uses it for delta), never a query or a document.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dpsynth.pipeline.config import PAIRS_FIELDS
from synthgen.user_pairs import PairsFileError, PairsSource, read_pairs, split_collection

PRESETS = ("demo", "tiny", "gpu")

TEMPLATE = '''"""The main job on your own pairs, written by `synthgen pipeline init --pairs`.

Pairs: {pairs} ({pairs_count} pairs naming {named} documents when written).
Documents indexed: {documents_note}.
Generator and encoder: the `{preset}` preset's, with its {steps} DP steps of expected batch
{batch} over your {train} train pairs (epochs {epochs:.4g}), delta 1/(10 n); a fifth of the
collection's documents is held out whole (with their pairs) to evaluate the encoders, and
the generator writes queries for the others.

    synthgen pipeline --config {config_name}
"""

import dataclasses

from dpsynth.configs import {preset}
from dpsynth.pipeline.config import DataConfig, RagStageConfig


def get_config():
    base = {preset}.get_config()
    generator = base.generate.querygen
    dp = dataclasses.replace(generator.dp, epochs={epochs!r})
    return dataclasses.replace(
        base,
        name={name!r},
        out={out!r},
        data=DataConfig(
            source=None,
            num_documents=None,
            test_fraction={test_fraction!r},
            pairs={pairs!r},
            documents={documents!r},
            query_field={query_field!r},
            document_field={document_field!r},
            doc_id_field={doc_id_field!r},
            text_field={text_field!r},
            id_field={id_field!r},
        ),
        generate=dataclasses.replace(base.generate, querygen=generator.replace(dp=dp)),
        # delta 1/(10 n) for the n train pairs (the run's default 1/(2 n) is near 1/n)
        privacy=dataclasses.replace(base.privacy, delta={delta!r}),
        {rag_note}
        rag={rag},
        # your real queries are private: the report shows none beside the synthetic ones
        report=dataclasses.replace(base.report, samples=0),
    )
'''


@dataclasses.dataclass(frozen=True)
class PairsPlan:
    """What `pairs_config_text` found and chose (public sizes only)."""

    pairs: int
    documents_named: int
    documents_indexed: int
    train_pairs: int
    epochs: float
    rag_records: int = 0  # the DP-RAG stage's collection (0: no stage)
    rag_questions: int = 0  # answered: as many as the preset's cap fits
    rag_questions_given: int = 0


def pairs_config_text(
    source: PairsSource,
    *,
    preset: str = "demo",
    name: str = "my-pairs",
    out: str | None = None,
    test_fraction: float = 0.2,
    config_name: str = "my-pairs.py",
    rag_records: str | None = None,
    rag_questions: str | None = None,
) -> tuple[str, PairsPlan]:
    """(the config file's text, its plan) for the pairs of `source`; with `rag_records` and
    `rag_questions`, a DP-RAG stage over those records answering those questions.

    Raises:
      PairsFileError: the first problem of the files, naming its line.
      ValueError: an unknown preset, or too few train pairs for one DP batch.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    from importlib import import_module

    base = import_module(f"dpsynth.configs.{preset}").get_config()
    if source.documents is None:
        raise PairsFileError(
            "the main job needs the public collection (--documents FILE): which documents the "
            "private pairs name is private, so it indexes and writes queries for a public one"
        )
    collection, pairs = read_pairs(source)
    named = len({p["doc_id"] for p in pairs})
    train = len(split_collection(collection, pairs, test_fraction=test_fraction, seed=base.seed)[0])
    dp = base.generate.querygen.dp
    steps = max(1, round(dp.epochs * _preset_train_pairs(base) / dp.batch_size))
    if train < dp.batch_size:
        raise ValueError(
            f"{source.pairs}: about {train} train pairs, fewer than one expected DP batch of "
            f"{dp.batch_size} (the {preset} preset's): collect more pairs or use another preset"
        )
    epochs = steps * dp.batch_size / train
    rag, counts = _rag_section(rag_records, rag_questions, base.rag)
    resolve = lambda p: None if p is None else str(Path(p).resolve())  # noqa: E731
    text = TEMPLATE.format(
        pairs=resolve(source.pairs),
        documents=resolve(source.documents),
        documents_note=f"the collection {resolve(source.documents)} ({len(collection)} documents)",
        pairs_count=len(pairs),
        named=named,
        preset=preset,
        steps=steps,
        batch=dp.batch_size,
        train=train,
        epochs=epochs,
        name=name,
        out=out or f"runs/{name}",
        test_fraction=test_fraction,
        config_name=config_name,
        delta=1.0 / (10 * train),
        **{field: getattr(source, field) for field in PAIRS_FIELDS},
        **rag,
    )
    return text, PairsPlan(len(pairs), named, len(collection), train, epochs, *counts)


def _rag_section(
    records: str | None, questions: str | None, base
) -> tuple[dict, tuple[int, int, int]]:
    """(the template's rag section, (records, questions answered, questions given)): a DP-RAG
    stage on `base` (the preset's rag section) over the user's collection and questions
    (checked: a corpus of doc_id and text, a questions file, a name the ledger takes), its
    delta cap below 1/(10 n) for n records, answering as many questions as its cap fits;
    or the stage turned off."""
    if (records is None) != (questions is None):
        raise ValueError("a DP-RAG stage needs both the private records and the questions")
    if records is None:
        return {
            "rag_note": "# the preset's DP-RAG stage answers over a packaged sample collection, "
            "not your data",
            "rag": "RagStageConfig(enabled=False)",
        }, (0, 0, 0)
    from dpsynth.pipeline.rag_stage import answers_that_fit, read_questions
    from synthgen.corpora import read_jsonl

    try:
        doc_ids = [str(row["doc_id"]) for row in read_jsonl(records, required=("doc_id", "text"))]
        given = len(read_questions(questions))
        records, questions = (str(Path(p).resolve()) for p in (records, questions))
        delta_cap = min(base.delta_cap, 1.0 / (10 * len(doc_ids)))
        rag = dataclasses.replace(
            base, records=records, questions_file=questions, questions=given,
            delta_cap=delta_cap, delta=min(base.delta, delta_cap),
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise PairsFileError(str(exc)) from None
    if len(set(doc_ids)) != len(doc_ids):
        raise PairsFileError(f"{records} repeats doc_ids")
    answered = answers_that_fit(rag)
    if not answered:
        raise PairsFileError(
            f"not one answer at epsilon={rag.epsilon:g} fits the preset's cap "
            f"epsilon={rag.epsilon_cap:g}"
        )
    note = f"# DP-RAG: {answered} of your {given} questions over your {len(doc_ids)} records"
    if answered < given:
        note += f" (what the cap epsilon={rag.epsilon_cap:g} fits: raise epsilon_cap for more)"
    return {
        "rag_note": note,
        "rag": f"dataclasses.replace(\n            base.rag, records={records!r},\n"
        f"            questions_file={questions!r},\n            questions={answered}, "
        f"delta={rag.delta!r}, delta_cap={rag.delta_cap!r},\n        )",
    }, (len(doc_ids), answered, given)


def _preset_train_pairs(config) -> int:
    """The train pairs the preset's epochs were set for (its wiki documents less the held-out
    share: one pair per document)."""
    documents = config.data.num_documents or 1000
    return documents - max(1, int(round(config.data.test_fraction * documents)))
