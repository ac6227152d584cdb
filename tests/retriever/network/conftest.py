"""One small network per test session: three contributors, one to kill, one misbehaving."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.retriever.network.harness import (
    SYNTHETIC,
    ContributorServer,
    Folders,
    MisbehavingServer,
    make_contributor,
    make_world,
    start_all,
)

KEY_CAPS = {"epsilon": 3.0, "delta": 1e-5, "collection_epsilon": 3.5, "collection_delta": 1e-5}


@dataclasses.dataclass
class Network:
    """The session's network: contributors by name, their servers, one key at each.

    ``north`` also serves /answer (tiny LM); ``doomed`` (east's documents, its own ledger)
    exists to be killed; ``misbehaving`` breaks the protocol on purpose.
    """

    root: Path
    world: dict[str, Path]
    folders: dict[str, Folders]
    servers: dict[str, ContributorServer]
    keys: dict[str, str]
    misbehaving: MisbehavingServer

    def url(self, name: str) -> str:
        return self.servers[name].url


@pytest.fixture(scope="session")
def network(tmp_path_factory):
    from dpsynth.service.contributor import add_key

    root = tmp_path_factory.mktemp("network")
    world = make_world(root)
    folders = {
        "north": make_contributor(root, "north", world, answer=True),
        "south": make_contributor(root, "south", world),
        "east": make_contributor(root, "east", world),
        "doomed": make_contributor(root, "doomed", world, documents=SYNTHETIC["east"]),
    }
    keys = {name: add_key(f.work, "client", **KEY_CAPS) for name, f in folders.items()}
    servers = {
        name: ContributorServer(f, root / f"{name}.log", answer=name == "north")
        for name, f in folders.items()
    }
    misbehaving = MisbehavingServer(root / "misbehaving.log")
    start_all([*servers.values(), misbehaving])
    yield Network(root, world, folders, servers, keys, misbehaving)
    for server in [*servers.values(), misbehaving]:
        server.stop()
