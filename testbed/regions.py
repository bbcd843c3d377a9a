"""Published inter-region round-trip times (traces/azure_rtt_ms.csv; see traces/SOURCE.md)."""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

__all__ = ["regions", "rtt_ms", "CONTINENT"]

_CSV = Path(__file__).parent / "traces" / "azure_rtt_ms.csv"

CONTINENT = {
    "East US": "North America", "Central US": "North America", "West US 2": "North America",
    "Brazil South": "South America", "West Europe": "Europe", "North Europe": "Europe",
    "South Africa North": "Africa", "Central India": "Asia", "Southeast Asia": "Asia", "Japan East": "Asia",
    "Australia East": "Oceania",
}


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str], float]:
    with open(_CSV, newline="") as f:
        return {(r["from"], r["to"]): float(r["rtt_ms"]) for r in csv.DictReader(f)}


def regions() -> list[str]:
    return sorted({a for a, _ in _table()})


def rtt_ms(a: str, b: str) -> float:
    """Median RTT between two regions (0 within a region)."""
    if a == b:
        return 0.0
    try:
        return _table()[(a, b)]
    except KeyError:
        known = ", ".join(regions())
        raise KeyError(f"no RTT for {a!r} -> {b!r}; known regions: {known}") from None
