"""Notebook widgets: a control panel that starts, stops and breaks a run, and a live dashboard.

Importing it in a Jupyter kernel makes plotly figures draw in rendered copies of the notebook
too (ui/render.py). Needs the `notebook` extra (ipywidgets, anywidget, ipykernel): `pip install wantrain[notebook]`.
"""

from .dashboard import Dashboard, site_states
from .panel import ControlPanel
from .render import draw_everywhere
from .sizes import panel_config, quick_mode, sized

__all__ = ["ControlPanel", "Dashboard", "site_states", "panel_config", "quick_mode", "sized", "draw_everywhere"]

draw_everywhere()        # figures that draw in rendered notebooks too (ui/render.py)
