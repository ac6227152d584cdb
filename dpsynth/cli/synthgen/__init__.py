"""`synthgen` command line: thin wrappers that parse arguments and call one library function.

One module per command group, or per family of top-level commands (`querygen`, `fewshot`,
`evolution`); `common` holds the option types only these commands share. jax, flax and
datasets are imported inside the commands so that `synthgen --help` and the calculators
start fast.
"""

from __future__ import annotations

from dpsynth.cli.shared import console_script, tool_app
from dpsynth.cli.synthgen import evolution, fewshot, querygen
from dpsynth.cli.synthgen.assets import assets_app
from dpsynth.cli.synthgen.audit import audit_app
from dpsynth.cli.synthgen.ledger import ledger_app
from dpsynth.cli.synthgen.lm import lm_app
from dpsynth.cli.synthgen.pipeline import pipeline_app
from dpsynth.cli.synthgen.privacy import privacy_app
from synthgen.command_line import USER_ERRORS, run

__all__ = ["USER_ERRORS", "app", "main", "run"]

app = tool_app("DP synthetic data: assets, privacy accounting, budget ledger.")
app.add_typer(assets_app, name="assets")
app.add_typer(privacy_app, name="privacy")
app.add_typer(ledger_app, name="ledger")
app.add_typer(lm_app, name="lm")
app.add_typer(audit_app, name="audit")
app.add_typer(pipeline_app, name="pipeline")
app.command("train-generator")(querygen.train_generator)
app.command("generate-queries")(querygen.generate_queries)
app.command("merge-queries")(querygen.merge_queries)
app.command("generate-docs")(fewshot.generate_docs)
app.command("generate-queries-fewshot")(fewshot.generate_queries_fewshot)
app.command("generate-docs-pe")(evolution.generate_docs_pe)
main = console_script(app)
