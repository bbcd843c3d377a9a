"""Notebook widgets: a live dashboard of a run (and, to come, its control panel).

Needs the `notebook` extra (ipywidgets, anywidget): `pip install wantrain[notebook]`.
"""

from .dashboard import Dashboard, thin

__all__ = ["Dashboard", "thin"]
