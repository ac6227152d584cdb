"""`retriever contributor build|serve|card|key add` and `retriever network query`: thin
wrappers over `retriever.network` (contributors of the retrieval network, and the engine that
asks them all).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.retriever.options import (
    AnswerTimeoutOption,
    CollectionDeltaOption,
    CollectionEpsilonOption,
    FactCorpusOption,
    GuaranteesAddUpOption,
    HostOption,
    MaxPairsOption,
    MaxQuestionTokensOption,
    MaxScoreOption,
    MaxTokensOption,
    MinScoreOption,
    PerAnswerDeltaOption,
    PortOption,
    QuestionOption,
    QueueOption,
    QueueTimeoutOption,
    ReleaseDatasetOption,
    ReleaseOutOption,
    ReplicasOption,
    ServedLmOption,
    rag_config,
    service_config,
)
from dpsynth.cli.shared import group_app
from synthgen.command_line import HelpGroup, choice, positive, probability

contributor_app = group_app(
    "A contributor of the retrieval network: its release, its keys, its server."
)
key_app = typer.Typer(cls=HelpGroup, help="API keys of a contributor (tenants of its own ledger).")
contributor_app.add_typer(key_app, name="key")
network_app = group_app("Ask every contributor of a network at once.")

DirOption = Annotated[Path, typer.Option("--dir", help="the release (knowledge) folder")]
WorkOption = Annotated[
    Path, typer.Option("--work", help="the contributor's private work folder (private.json)")
]

# `network query`
ContributorsOption = Annotated[str, typer.Option(help="contributor URLs, comma-separated")]
KeysOption = Annotated[
    Path, typer.Option(help="JSON file {url: API key} (keys never on the command line)")
]
TimeoutOption = Annotated[float, typer.Option(help="seconds per contributor, retries included")]
RerankOption = Annotated[
    str | None, typer.Option(help="re-score the merged hits with this local encoder")
]
AnswerLmOption = Annotated[
    str, typer.Option(help="local LM answering over the documents ('tiny'; 'none': off)")
]
ModeOption = Annotated[
    str, typer.Option(help="retrieve (free) | answer (each contributor's DP /answer)")
]
CardsOption = Annotated[
    bool, typer.Option("--cards/--no-cards", help="fetch each contributor's card first")
]


# `contributor build`
BuildEpsilonOption = Annotated[
    float, typer.Option(help="epsilon of the whole release (paid once)", callback=positive)
]
BuildNameOption = Annotated[
    str | None, typer.Option(help="contributor's public name (default: --out's name)")
]
BuildDeltaOption = Annotated[
    float, typer.Option(help="delta of the whole release, below 1/n", callback=probability)
]
BuildExtractorOption = Annotated[
    str,
    choice(
        "typed",
        "phrases",
        help="typed (a subject and its typed value) or phrases (pairs of key phrases, "
        "answered by the LM picking a partner)",
    ),
]
BuildWorkOption = Annotated[
    Path | None,
    typer.Option(help="private work folder: ledger, keys, private index (never ship it)"),
]
BuildLedgerOption = Annotated[
    str | None, typer.Option(help="ledger file or URL (default: <work>/ledger.sqlite)")
]
BuildAnswerIndexOption = Annotated[
    bool, typer.Option(help="also index the private corpus for /answer (work folder)")
]


@contributor_app.command("build")
def build(
    private: FactCorpusOption,
    epsilon: BuildEpsilonOption,
    out: ReleaseOutOption,
    name: BuildNameOption = None,
    delta: BuildDeltaOption = 1e-6,
    max_pairs: MaxPairsOption = 1,
    extractor: BuildExtractorOption = "typed",
    work: BuildWorkOption = None,
    ledger: BuildLedgerOption = None,
    dataset: ReleaseDatasetOption = None,
    guarantees_add_up: GuaranteesAddUpOption = False,
    encoder: Annotated[str, typer.Option(help="encoder of the indexes")] = "all-minilm-l6-v2",
    answer_index: BuildAnswerIndexOption = True,
) -> None:
    """Release a contributor's facts once: records, index, card.

    Each record's facts (a subject and its typed value, by a public rule); the facts many
    records state are released (PipelineDP partition selection) and written as one record
    per subject, listing its released values. One charge on the contributor's ledger before
    any noise; a release that could carry nothing is refused before the charge. (The
    cluster release, --mode clusters, was retired: see the knowledge guide.)
    """
    from retriever.network.knowledge import build_knowledge, summary
    from synthgen.knowledge import FactConfig

    config = FactConfig(epsilon=epsilon, delta=delta, max_pairs=max_pairs, extractor=extractor)
    result = build_knowledge(
        private,
        out,
        config,
        contributor=name or out.name,
        work=work,
        ledger=ledger,
        dataset=dataset,
        encoder=encoder,
        answer_index=answer_index,
        guarantees_add_up=guarantees_add_up,
    )
    print(summary(result))


@contributor_app.command("serve")
def serve(
    release: DirOption,
    work: WorkOption,
    host: HostOption = "127.0.0.1",
    port: PortOption = 0,
    answer: Annotated[
        bool, typer.Option("--answer/--no-answer", help="also serve DP answers (/answer)")
    ] = False,
    lm: ServedLmOption = "smollm2-135m-instruct",
    answer_epsilon: Annotated[float, typer.Option(help="every answer's epsilon")] = 1.0,
    mechanism: Annotated[str, typer.Option(help="every answer's: icl | keywords | facts")] = "icl",
    replicas: ReplicasOption = 1,
    queue: QueueOption = 16,
    queue_timeout: QueueTimeoutOption = 30.0,
    max_question_tokens: MaxQuestionTokensOption = 128,
    answer_timeout: AnswerTimeoutOption = 120.0,
    k: Annotated[int, typer.Option(help="documents the DP threshold aims to select")] = 8,
    max_tokens: MaxTokensOption = 12,
    delta: PerAnswerDeltaOption = 1e-6,
    min_score: MinScoreOption = 0.0,
    max_score: MaxScoreOption = 1.0,
) -> None:
    """Serve a contributor's release: /retrieve (free), /card, and with --answer /answer.

    /retrieve searches the DP synthetic documents only (post-processing: no budget spent);
    /answer gives DP answers from the private collection, charged to the caller's tenant on
    this contributor's own ledger. Callers need a key from `retriever contributor key add`.
    """
    from dpsynth.service.contributor import load_contributor
    from dpsynth.service.server import serve as serve_forever

    service = load_contributor(
        release,
        work,
        answer=answer,
        lm=lm,
        rag_config=rag_config(k, max_tokens, delta, min_score, max_score),
        config=service_config(
            answer_epsilon, mechanism, queue, queue_timeout, max_question_tokens, answer_timeout
        ),
        replicas=replicas,
    )
    serve_forever(service, host=host, port=port)


@contributor_app.command("card")
def card(release: DirOption) -> None:
    """Print the card of a release: what it holds and its (epsilon, delta) guarantee."""
    from retriever.network.folder import read_card

    print(json.dumps(read_card(release), indent=1))


@key_app.command("add")
def key_add(
    name: Annotated[str, typer.Argument(help="the caller's (tenant's) name")],
    work: WorkOption,
    epsilon: Annotated[
        float, typer.Option(help="the tenant's epsilon cap for /answer", callback=positive)
    ],
    delta: Annotated[float, typer.Option(help="its delta cap", callback=probability)],
    collection_epsilon: CollectionEpsilonOption = None,
    collection_delta: CollectionDeltaOption = None,
) -> None:
    """Register a caller on this contributor's ledger and print its API key (shown once).

    The key works at this contributor only. /retrieve is free whatever the cap; the cap
    bounds the caller's /answer calls.
    """
    from dpsynth.service.contributor import add_key

    print(
        add_key(
            work,
            name,
            epsilon=epsilon,
            delta=delta,
            collection_epsilon=collection_epsilon,
            collection_delta=collection_delta,
        )
    )


@network_app.command("query")
def query(
    contributors: ContributorsOption,
    keys: KeysOption,
    question: QuestionOption,
    k: Annotated[int, typer.Option(help="documents to return (asked of each contributor)")] = 10,
    timeout: TimeoutOption = 10.0,
    retries: Annotated[int, typer.Option(help="retries after a transport error or 5xx")] = 2,
    rerank: RerankOption = None,
    lm: AnswerLmOption = "none",
    mode: ModeOption = "retrieve",
    max_response_bytes: Annotated[int, typer.Option(help="largest reply accepted")] = 1 << 20,
    cards: CardsOption = True,
) -> None:
    """Ask every contributor at once; print the merged result as JSON.

    Exit code 0 when at least one contributor answered (stderr names those that did not),
    1 when none did. /retrieve is free at every contributor; --mode answer spends each
    contributor's per-answer epsilon from your budget there.
    """
    from retriever.network.engine import (
        Contributor,
        EngineConfig,
        NetworkQueryEngine,
        Reranker,
        load_answer_lm,
    )

    urls, key_of = _contributor_keys(contributors, keys)
    model, prompt, lm_name = None, None, None
    if lm.lower() != "none":
        model, prompt = load_answer_lm(lm)
        lm_name = lm
    engine = NetworkQueryEngine(
        [Contributor(url, key_of[url]) for url in urls],
        config=EngineConfig(
            k=k, timeout=timeout, retries=retries, max_response_bytes=max_response_bytes
        ),
        reranker=Reranker.load(rerank) if rerank else None,
        lm=model,
        prompt=prompt,
        lm_name=lm_name,
    )
    response = engine.query_sync(question, mode=mode, cards=cards)
    print(json.dumps(response.to_json(), indent=1))
    for report in response.failed:
        print(f"warning: {report.name}: {report.status}: {report.reason}", file=sys.stderr)
    if response.all_failed:
        print(f"error: all {len(urls)} contributors failed", file=sys.stderr)
        raise typer.Exit(1)


def _contributor_keys(contributors: str, keys: Path) -> tuple[list[str], dict[str, str]]:
    """(urls, {url: key}): the --contributors URLs and the --keys JSON file {url: key}
    (trailing slashes ignored), which must hold a key for each of them."""
    urls = [u.strip().rstrip("/") for u in contributors.split(",") if u.strip()]
    if not urls:
        raise ValueError("--contributors names no URL")
    try:
        read = json.loads(keys.read_text())
    except json.JSONDecodeError:
        raise ValueError(f"{keys} is not JSON: expected {{url: key}}") from None
    if not isinstance(read, dict) or not all(
        isinstance(u, str) and isinstance(k, str) for u, k in read.items()
    ):
        raise ValueError(f"{keys} must be a JSON object {{url: key}}")
    key_of = {url.rstrip("/"): key for url, key in read.items()}
    missing = [url for url in urls if url not in key_of]
    if missing:
        raise ValueError(f"{keys} has no key for {', '.join(missing)}")
    return urls, key_of
