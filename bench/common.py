"""Helpers shared by the benchmarks: single-core setup, result files (real deltas: wantrain.studies.compression)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def single_core() -> None:
    """Per-core figures: one thread everywhere (call before numpy/torch do real work)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    result = {"machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                          "cores": os.cpu_count()}, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def save_to(out: str, result: dict) -> Path:
    """`--out`: a path ending in .json (tests pass one in their temporary folder), or a result name
    under bench/results."""
    if out.endswith(".json"):
        path = Path(out)
        path.write_text(json.dumps(result, indent=2))
        return path
    return save(out, result)
