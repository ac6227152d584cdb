"""The command-line reference is generated from the commands: every option of every command."""

from __future__ import annotations

import typer.main

from dpsynth.cli.reference import cli_reference


def _options(group, path=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _options(command, (*path, name))
        else:
            for param in command.params:
                for opt in getattr(param, "opts", []):
                    if opt.startswith("--") and not getattr(param, "hidden", False):
                        yield (*path, name), opt


def test_every_option_of_every_command_is_in_the_reference():
    from dpsynth.cli.retriever import app as retriever_app
    from dpsynth.cli.synthgen import app as synthgen_app

    apps = {"synthgen": synthgen_app, "retriever": retriever_app}
    text = cli_reference(apps)
    for program, app in apps.items():
        for path, opt in _options(typer.main.get_command(app)):
            heading = f"### `{' '.join((program, *path))}`"
            assert heading in text, heading
            section = text.split(heading, 1)[1].split("\n### ", 1)[0]
            assert f"`{opt}" in section, (heading, opt)
    release = text.split("### `retriever knowledge release`", 1)[1].split("\n### ", 1)[0]
    for opt in ("--max-pairs", "--extractor", "--backend", "--dry-run"):
        assert f"`{opt} " in release or f"`{opt}`" in release, opt
    for retired in ("--mode", "--fields", "--max-keywords", "--voters", "--shard"):  # clusters
        assert f"`{retired}" not in release, retired
