"""A run's rounds in one process, for studies, benchmarks and tutorials: the harness
(`inprocess.py`), the codec's measurements (`compression.py`), what to do with a delta that misses its
round (`late.py`, with the Hadamard spread of its baseline B5, `spread.py`)."""
