"""Moved to wantrain.ps (kept for one release)."""

from .ps.server import ParameterServer
from .ps.sites import SiteLink

__all__ = ["ParameterServer", "SiteLink"]
