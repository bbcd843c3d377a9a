"""Moved to wantrain.ps.servicer and wantrain.ps.serve (kept for one release)."""

from .ps.serve import serve
from .ps.servicer import STATUS, Servicer, add_to_server, peer_host

__all__ = ["Servicer", "STATUS", "add_to_server", "peer_host", "serve"]
