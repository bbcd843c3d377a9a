"""Figures that draw wherever a notebook is read.

Under a Jupyter kernel plotly writes each figure only as its own JSON mimetype: JupyterLab draws
it, an HTML export (nbconvert, nbviewer, a repository page) draws nothing. Plotly's `notebook`
renderer adds an HTML copy of each figure and, once per kernel, plotly.js itself inline (about
4.8 MB; no network needed to view the notebook). Importing `wantrain.ui` in a kernel turns it on,
unless PLOTLY_RENDERER or an earlier `pio.renderers.default = ...` chose otherwise.
"""

from __future__ import annotations

import os

__all__ = ["draw_everywhere"]

EVERYWHERE = "plotly_mimetype+notebook"


def draw_everywhere(force: bool = False) -> bool:
    """Make plotly figures draw in JupyterLab and in rendered copies alike; True if turned on."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):         # a terminal or a script: nothing to render
        return False
    import plotly.io as pio

    chosen = os.environ.get("PLOTLY_RENDERER") or pio.renderers.default
    if not force and (os.environ.get("PLOTLY_RENDERER") or "notebook" in chosen.split("+")):
        return "notebook" in chosen.split("+")
    pio.renderers.default = EVERYWHERE
    return True
