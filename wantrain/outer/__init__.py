"""The outer step: what a round's deltas become at the PS. Screened against each other
(`screening.py`), checked on held-out data (`checking.py`), aggregated (`aggregate.py`, its compiled
element loops `kernels.py`) and applied by the outer optimizer (`nesterov.py`); Streaming DiLoCo's
fragments say which tensors a round moves (`fragments.py`). Shared by the PS and the in-process
studies; nothing here knows of the wire."""
