import subprocess
import sys

from .reaper import descendants, reap


def test_reap_kills_what_a_test_left_running_and_names_it():
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # leaked on purpose"])
    try:
        assert orphan.pid in descendants(__import__("os").getpid())
        named = reap(grace_s=0.2)
        assert any(line.startswith(f"{orphan.pid}:") and "leaked on purpose" in line for line in named), named
        assert orphan.wait(10) == -9
    finally:
        orphan.kill()
        orphan.wait(10)
