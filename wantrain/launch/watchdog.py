"""The watchdog every process started over SSH runs under (ssh.py): the script, run on the host.

It reads the command, its environment and folder as the first line of its stdin (so secrets never
appear on a command line), starts the command in the process group sshd made for the session,
prints that group and the command's pid, and waits. When its stdin ends, which is when the SSH
channel closes, it sends SIGTERM to the whole group, and SIGKILL 5 s later.
"""

__all__ = ["WATCHDOG"]

WATCHDOG = r"""
import json, os, signal, subprocess, sys, threading, time
signal.signal(signal.SIGTERM, lambda *_: None)      # a handler, not SIG_IGN: the command gets the default back
line = b""
while not line.endswith(b"\n"):                      # unbuffered: the rest of stdin is watched below
    more = os.read(0, 1)
    if not more:
        sys.exit(1)
    line += more
spec = json.loads(line)
try:
    child = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env={**os.environ, **spec["env"]}, stdin=subprocess.DEVNULL)
except OSError as e:
    print("wantrain-error", e, flush=True)
    sys.exit(127)
print("wantrain-started", os.getpgrp(), child.pid, flush=True)
def hang_up():
    while os.read(0, 65536):                         # until EOF: the SSH channel closed
        pass
    os.killpg(0, signal.SIGTERM)
    deadline = time.time() + 5
    while child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=hang_up, daemon=True).start()
code = child.wait()
sys.stdout.flush()
os._exit(code if code >= 0 else 128 - code)          # not sys.exit: the reader thread holds stdin
"""
