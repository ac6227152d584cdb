"""Option types that only `synthgen`'s commands share (not `retriever`'s), and the loading of
the LM and the generator preset that their options name.

What `dpsynth.cli.retriever` uses too lives in the library module `synthgen.command_line`.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated

import typer

from synthgen.command_line import choice, positive

SplitOption = Annotated[
    str,
    choice("all", "train", "test", help="wiki corpus only: the split of documents to use"),
]
PresetOption = Annotated[
    str,
    typer.Option(
        help="query-generator preset: a name in dpsynth/configs/querygen.py (shipped with the "
        "package), or path/to/file.py:NAME (an entry of that file's PRESETS dict)"
    ),
]

SeedOption = Annotated[
    int | None,
    typer.Option(help="tests only: a fixed seed makes the release reproducible (warned)"),
]
TenantOption = Annotated[str, typer.Option(help="ledger tenant")]
DatasetOption = Annotated[str | None, typer.Option(help="ledger dataset (default: file name)")]
TextFieldOption = Annotated[str, typer.Option(help="field of the private text")]
DeclaredDeltaOption = Annotated[float | None, typer.Option(help="below 1/N; default 1/(10N)")]
ExpectedBatchOption = Annotated[int | None, typer.Option(help="expected batch size")]
BudgetOption = Annotated[
    float | None, typer.Option(help="epsilon cap of a new ledger scope", callback=positive)
]
SEED_WARNING = (
    "warning: --seed fixes the mechanism's randomness: anyone who knows it can replay the "
    "noise; for tests only, not for publication (recorded in metadata.json)"
)
ModelOption = Annotated[
    str,
    typer.Option(help="asset name, .gguf file or HF Llama folder; 'tiny' = the test LM"),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        help="OpenAI-compatible base URL (e.g. http://localhost:8000/v1) of a server you run "
        "yourself: it sees the private prompts; --model then only names the tokenizer, and "
        "--server-model the served model"
    ),
]
ServerModelOption = Annotated[str | None, typer.Option(help="served model name")]
ServerContextOption = Annotated[
    int | None,
    typer.Option(
        help="context length (tokens) the server was started with; required with --server"
    ),
]
ServerPromptOption = Annotated[
    str,
    choice(
        "auto",
        "tokens",
        "text",
        help="how prompts reach --server; auto probes it once with a "
        "public prompt and sends token ids where accepted, text otherwise",
    ),
]
TopLogprobsOption = Annotated[
    int, typer.Option(help="log-probs per --server reply (servers cap it, often at 20)")
]
ServerConcurrencyOption = Annotated[
    int, typer.Option(help="--server requests in flight at once (the M prompts of a token)")
]
FewShotMechanismOption = Annotated[
    str, choice("gaussian", "rnm", help="the token release: Gaussian votes or report-noisy-max")
]
ResampleOption = Annotated[
    str,
    choice(
        "token", "example", help="resample the private subsets per token or per example (KV cache)"
    ),
]


def preset_with(config: str, exact: dict, **given):
    """The query-generator preset `config` (`querygen_preset`) with the `exact` changes and
    those of `given` whose option was given (not None)."""
    from dpsynth.config_files import querygen_preset

    changes = {name: value for name, value in given.items() if value is not None}
    return querygen_preset(config).replace(**changes, **exact)


def lm_options(*options) -> tuple[tuple, str]:
    """The LM options (model, server, server model, server context, prompt, top log-probs,
    concurrency) as `load_lm` takes them, and the LM's name in the release's metadata; a
    usage error for --server without --server-context."""
    model, server, server_model, server_context = options[:4]
    if server is not None and server_context is None:
        raise typer.BadParameter("--server needs --server-context (the server's context length)")
    return options, model if server is None else f"{server} ({server_model or model})"


@contextlib.contextmanager
def load_lm(
    model: str,
    server: str | None,
    server_model: str | None,
    server_context: int | None,
    prompt: str,
    top_logprobs: int,
    concurrency: int,
    *,
    warn_unchecked: bool = False,
):
    """The LM that the LM options name (`synthgen.lm_backends.load_backend`), closed after
    the block, also on an error (a server backend: no request may outlive the run).

    A server's public probe note goes to stderr, as ``server: ...``, or as ``warning: ...``
    where `warn_unchecked` and the server's tokenization could not be checked.
    """
    from synthgen.lm_backends import load_backend

    options = {"prompt_format": prompt, "top_logprobs": top_logprobs, "concurrency": concurrency}
    lm, check = load_backend(model, server, server_model, server_context, options)
    if check is not None:
        unchecked = warn_unchecked and check.tokenization == "unchecked"
        print(f"{'warning' if unchecked else 'server'}: {check.note}", file=sys.stderr)
    try:
        yield lm
    finally:
        close = getattr(lm, "close", None)
        if callable(close):
            close()
