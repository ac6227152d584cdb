"""`retriever` command line: thin wrappers over the retriever library.

One module per command group, or per family of top-level commands (`train`, `evaluate`,
`export`); `options` holds the option types these commands share. jax, flax, scann and
datasets are imported inside the commands so `--help` starts fast.
"""

from __future__ import annotations

from dpsynth.cli.retriever import evaluate, export, network, rag, service, train
from dpsynth.cli.retriever.data import data_app
from dpsynth.cli.retriever.index import index_app
from dpsynth.cli.retriever.knowledge import knowledge_app
from dpsynth.cli.shared import console_script, tool_app
from synthgen.command_line import run

__all__ = ["app", "main", "run"]

app = tool_app("Retrieval on DP synthetic data.")
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")
app.add_typer(rag.privacy_app, name="privacy")
app.command("answer")(rag.answer)
app.command("serve")(service.serve)
app.add_typer(service.tenant_app, name="tenant")
app.add_typer(network.contributor_app, name="contributor")
app.add_typer(network.network_app, name="network")
app.add_typer(knowledge_app, name="knowledge")
app.command("train")(train.train)
app.command("train-dp")(train.train_dp)
app.command("evaluate")(evaluate.evaluate)
app.command("export")(export.export)
main = console_script(app)
