"""A subprocess environment with XLA flags added to the inherited ones, never replacing them.

The suite's `XLA_FLAGS` (tests/conftest.py: the CPU loop emitters, and whatever the caller
set) reach every subprocess; a test that needs one more flag (host devices, an optimisation
level) appends it here, so its processes compile as the rest of the suite's do.
"""

from __future__ import annotations

import os


def with_xla_flags(*flags: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's environment) whose `XLA_FLAGS` ends with
    `flags` (XLA reads flags in order: a later one wins over an inherited one)."""
    out = dict(os.environ if env is None else env)
    out["XLA_FLAGS"] = " ".join([out.get("XLA_FLAGS", ""), *flags]).strip()
    return out
