"""Matplotlib for files: the Agg backend, so that plots never need a display (CLIs, services, CI).

Privacy:
  Nothing here sees data; callers plot aggregates only.
"""

from __future__ import annotations


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (imported on first use: matplotlib is slow to
    import and most commands draw nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
