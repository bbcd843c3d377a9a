"""What a PS or site process runs with: its one thread pool for CPU-bound work (`cpu_pool.py`), how
it holds its memory (`memory.py`), and the faults a test or a study injects on purpose: stalls
(`faults.py`) and chunks lost on the uplink (`chunk_loss.py`)."""
