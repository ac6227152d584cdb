"""`retriever data wiki | medical | facts | filter`: prepare retrieval datasets in the plain JSONL
formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import group_app
from synthgen.command_line import DocumentsLimitOption, OutFolderOption, usage_errors

data_app = group_app("Prepare retrieval datasets in the plain JSONL formats.")


@data_app.command("wiki")
def data_wiki(
    out: OutFolderOption,
    source: Annotated[str, typer.Option(help="asset name or path")] = "wiki-summaries-en",
    test_fraction: Annotated[float, typer.Option(help="held-out share of documents")] = 0.2,
    seed: Annotated[int, typer.Option(help="split seed")] = 0,
    limit: DocumentsLimitOption = None,
) -> None:
    """Write corpus.jsonl and train/test query files for the wiki summaries."""
    from retriever import data

    counts = data.export_wiki(
        out, source=source, test_fraction=test_fraction, seed=seed, limit=limit
    )
    print(json.dumps(counts))


@data_app.command("medical")
def data_medical(
    out: OutFolderOption,
    num_records: Annotated[int, typer.Option(help="records (each names one disease)")] = 2000,
    num_diseases: Annotated[int, typer.Option(help="invented diseases")] = 60,
    per_disease: Annotated[int, typer.Option(help="questions per disease, 1 to 6")] = 1,
    seed: Annotated[int, typer.Option(help="same seed and sizes: same world")] = 0,
) -> None:
    """Write a sample private collection: invented-disease records (corpus.jsonl) and
    questions with their answers (questions.jsonl). No LM knows these diseases, so a right
    answer comes from the records; the DP-RAG evaluation's world is the default."""
    from dpsynth.evaluation import medical_world

    with usage_errors(ValueError):
        summary = medical_world.write_world(out, num_records, num_diseases, per_disease, seed)
    print(json.dumps({"out": str(out)} | summary))


@data_app.command("facts")
def data_facts(
    out: OutFolderOption,
    domain: Annotated[
        str,
        typer.Option(
            help="templated: people (validation), products, species; natural text "
            "(tickets, notes, e-mails): helpdesk (validation), facilities, lab"
        ),
    ] = "products",
    facts_per_level: Annotated[
        int, typer.Option(help="facts stated 1, 3, 5, 10, 20 and 50 times, each")
    ] = 5,
    seed: Annotated[int, typer.Option(help="same seed: same world")] = 0,
) -> None:
    """Write a sample private collection of invented entities and their facts (corpus.jsonl)
    and one question per fact with its support (questions.jsonl)."""
    from dpsynth.evaluation import fact_world, natural_world

    domains = (*fact_world.DOMAINS, *natural_world.DOMAINS)
    if domain not in domains:
        raise typer.BadParameter(f"--domain must be one of {', '.join(domains)}")
    if facts_per_level < 1:
        raise typer.BadParameter("--facts-per-level must be >= 1")
    if domain in natural_world.DOMAINS:
        with usage_errors(ValueError):  # more facts than the domain has subjects for
            world = natural_world.make_natural_world(
                domain, facts_per_level=facts_per_level, seed=seed
            )
    else:
        world = fact_world.make_world(domain, facts_per_level=facts_per_level, seed=seed)
    print(json.dumps({"out": str(out)} | fact_world.write_world(world, out)))


@data_app.command("filter")
def data_filter(
    queries: Annotated[
        Path, typer.Option(help="a generator's output folder (queries.jsonl, metadata.json)")
    ],
    corpus: Annotated[
        Path, typer.Option(help="corpus.jsonl: the public documents searched (doc_id, text)")
    ],
    out: Annotated[Path, typer.Option(help="folder of the kept queries (same layout)")],
    k: Annotated[int, typer.Option(help="keep a query if its document ranks in the top k")] = 10,
    encoder: Annotated[
        str, typer.Option(help="a public pretrained encoder (asset, random:..., folder)")
    ] = "all-minilm-l6-v2",
    max_query_len: Annotated[int, typer.Option(help="query tokens")] = 32,
    max_doc_len: Annotated[int, typer.Option(help="document tokens")] = 128,
    dedupe: Annotated[
        bool, typer.Option("--dedupe/--no-dedupe", help="drop empty and repeated pairs")
    ] = True,
) -> None:
    """Round-trip consistency filter of DP synthetic queries (Dai et al. 2022): keep those
    whose document a public encoder ranks in the top k. Post-processing: no budget spent."""
    from retriever.consistency import ConsistencyFilter, filter_query_folder

    for path, name in ((queries / "metadata.json", "--queries"), (corpus, "--corpus")):
        if not path.is_file():
            raise typer.BadParameter(f"{path} is not a file", param_hint=name)
    with usage_errors(ValueError):
        config = ConsistencyFilter(
            k=k,
            encoder=encoder,
            max_query_len=max_query_len,
            max_doc_len=max_doc_len,
            dedupe=dedupe,
        )
    record = filter_query_folder(queries, corpus, out, config, progress=True)
    print(json.dumps({"out": str(out), "queries_in": record["queries_in"], "kept": record["kept"]}))
