"""Moved to wantrain.site (kept for one release)."""

from .site.session import Site, SiteOptions, default_device

__all__ = ["Site", "SiteOptions", "default_device"]
