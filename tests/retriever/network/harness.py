"""A small retrieval network for tests: contributors' folders, their servers, bad servers.

Each contributor gets a release folder written by `write_knowledge_folder` from hand-written
"synthetic" documents (the DP builder is tested elsewhere), a private work folder over a
fictional medical collection (`dpsynth.evaluation.medical_world`) with its own ledger, and a
`retriever contributor serve` process on a loopback port it picks itself. The misbehaving
contributor (`misbehaving.py`) is a real HTTP server whose replies break the protocol.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import cli_process
import httpx

from tests.dpsynth.service.harness import Server, cli

REPO = Path(__file__).resolve().parents[3]
ENCODER = "all-minilm-l6-v2"
DATASET = "corpus"
CARD_EPSILON, CARD_DELTA = 2.0, 1e-6
ANSWER_EPSILON = 1.0
MISBEHAVING = Path(__file__).with_name("misbehaving.py")

# Hand-written stand-ins for DP synthetic documents: three contributors, overlapping topics.
SYNTHETIC: dict[str, list[tuple[str, str]]] = {
    "north": [
        ("fever", "Patients with marsh fever report a high temperature and night sweats."),
        ("fever", "Marsh fever is treated with rest, fluids and a course of quinaline."),
        ("cough", "A dry cough that lasts for weeks can point to grey lung."),
        ("rash", "Copper rash starts on the hands and spreads to the arms."),
        ("joints", "Stiff joints in the morning are common in river ague."),
        ("sleep", "Poor sleep and fatigue follow most long infections."),
    ],
    "south": [
        ("fever", "A sudden fever with chills is the first sign of harbor flu."),
        ("stomach", "Harbor flu often brings nausea and stomach cramps."),
        ("rash", "Copper rash itches at night and fades after ten days."),
        ("cough", "Grey lung patients cough up dark mucus after exertion."),
        ("eyes", "Red, watery eyes are an early symptom of pollen blight."),
    ],
    "east": [
        ("joints", "River ague causes swollen knees and aching wrists."),
        ("fever", "Low fevers in the evening are typical of river ague."),
        ("headache", "Pressure headaches behind the eyes come with dust sickness."),
        ("cough", "A barking cough in children can be dust sickness."),
        ("rash", "Small red spots on the chest appear with harbor flu."),
        ("fatigue", "Long fatigue after marsh fever may last for months."),
        ("eyes", "Pollen blight makes the eyelids swell in spring."),
    ],
}


def child_env() -> dict[str, str]:
    return {**os.environ, "HF_DATASETS_OFFLINE": "1"}


def make_world(root: Path) -> dict[str, Path]:
    """A fictional private medical collection (30 records, 5 diseases) and its exact index."""
    from retriever.index_folder import build_index_folder

    out = root / "private"
    cli_process.run(
        [sys.executable, "-m", "dpsynth.evaluation.medical_world", "--out", str(out),
         "--num-records", "30", "--num-diseases", "5", "--seed", "0"],
        check=True, capture_output=True, env=child_env(),
    )  # fmt: skip
    build_index_folder(out / "corpus.jsonl", root / "private-index", encoder=ENCODER, kind="exact")
    return {
        "private_corpus": out / "corpus.jsonl",
        "private_index": root / "private-index",
        "questions": out / "questions.jsonl",
    }


def questions(world: dict[str, Path]) -> list[str]:
    return [json.loads(line)["question"] for line in world["questions"].read_text().splitlines()]


@dataclasses.dataclass
class Folders:
    """A contributor's release folder and private work folder."""

    name: str
    release: Path
    work: Path

    @property
    def ledger(self) -> Path:
        return self.work / "ledger.sqlite"

    def synthetic(self) -> dict[str, str]:
        rows = [
            json.loads(line)
            for line in (self.release / "synthetic.jsonl").read_text().split("\n")
            if line
        ]
        return {row["doc_id"]: row["text"] for row in rows}


def make_contributor(
    root: Path,
    name: str,
    world: dict[str, Path],
    *,
    answer: bool = False,
    documents: list[tuple[str, str]] | None = None,
) -> Folders:
    """Writes `name`'s release folder (`documents`, default SYNTHETIC[name]: (topic, text)
    pairs) and its private work folder (own ledger; the exact private index if `answer`)."""
    from retriever.network.folder import make_card, write_knowledge_folder, write_private_record

    topics, texts = zip(*(documents or SYNTHETIC[name]))
    card = make_card(
        contributor=name, epsilon=CARD_EPSILON, delta=CARD_DELTA,
        generator="hand-written test documents", model="none", encoder=ENCODER,
        num_documents=len(texts), seeded=True,
    )  # fmt: skip
    release, work = root / name / "release", root / name / "work"
    write_knowledge_folder(release, texts, topics, card)
    write_private_record(
        work,
        {
            "contributor": name,
            "dataset": DATASET,
            "private_corpus": str(world["private_corpus"]),
            "private_index": str(world["private_index"]) if answer else None,
            "ledger": str(work / "ledger.sqlite"),
            "release": str(release),
        },
    )
    return Folders(name, release, work)


class ChildServer(Server):
    """A server command in a child process that prints ``serving http://HOST:PORT``.

    `launch` starts it and `wait_ready` waits for it, so several can start at once.
    """

    cwd = REPO

    def __init__(self, args: list[object], log: Path) -> None:
        self.args, self.log = list(args), log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class ContributorServer(ChildServer):
    """`retriever contributor serve` over a contributor's folders (tiny LM for /answer)."""

    def __init__(self, folders: Folders, log: Path, *, answer: bool = False) -> None:
        args: list[object] = [
            sys.executable, "-m", "dpsynth.cli.retriever", "contributor", "serve",
            "--dir", folders.release, "--work", folders.work,
        ]  # fmt: skip
        if answer:
            args += ["--answer", "--lm", "tiny", "--answer-epsilon", ANSWER_EPSILON,
                     "--k", "4", "--max-tokens", "6", "--min-score", "0.2"]  # fmt: skip
        super().__init__(args, log)
        self.folders = folders


class MisbehavingServer(ChildServer):
    """`misbehaving.py`: ``url(behaviour)`` is a contributor that breaks the protocol."""

    def __init__(self, log: Path) -> None:
        super().__init__([sys.executable, MISBEHAVING], log)

    def at(self, behaviour: str) -> str:
        return f"{self.url}/{behaviour}"

    def request_times(self, behaviour: str) -> list[float]:
        return httpx.get(f"{self.url}/{behaviour}/log", timeout=10).json()["times"]


def start_all(servers: list[ChildServer]) -> list[ChildServer]:
    """Launches every server, then waits for each (they start in parallel)."""
    for server in servers:
        server.launch()
    try:
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.kill()
        raise
    return servers


def established_connections(port: int) -> int:
    """TCP connections in state ESTABLISHED on local `port` (IPv4, from /proc/net/tcp).

    Counts accepted and not-yet-accepted ones: a stopped server's kernel still completes
    handshakes into its listen backlog.
    """
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        if state == "01" and int(local.split(":")[1], 16) == port:
            count += 1
    return count


def free_port_url() -> str:
    """A loopback URL where nothing listens (a port bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def write_keys(path: Path, keys: dict[str, str]) -> Path:
    """The ``--keys`` file of `retriever network query`: {url: key}, owner-only."""
    path.write_text(json.dumps(keys))
    path.chmod(0o600)
    return path


__all__ = [
    "ANSWER_EPSILON",
    "CARD_DELTA",
    "CARD_EPSILON",
    "DATASET",
    "ENCODER",
    "SYNTHETIC",
    "ContributorServer",
    "Folders",
    "MisbehavingServer",
    "cli",
    "established_connections",
    "free_port_url",
    "make_contributor",
    "make_world",
    "questions",
    "start_all",
    "write_keys",
]
