"""Notebook widgets: a control panel that starts, stops and breaks a run, and a live dashboard.

Needs the `notebook` extra (ipywidgets, ipykernel): `pip install wantrain[notebook]`.
"""

from .dashboard import Dashboard, site_states
from .panel import ControlPanel
from .sizes import quick_mode, sized

__all__ = ["ControlPanel", "Dashboard", "site_states", "quick_mode", "sized"]
