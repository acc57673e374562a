"""`rllib evaluate` turns SIGTERM into SystemExit, so its engine is shut down in a `finally`."""

import subprocess
import sys

CHILD = """
import os, signal, time
from rllib_arpo.cli import exit_on_sigterm
exit_on_sigterm()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
finally:
    print("engine closed", flush=True)
"""


def test_sigterm_runs_finally_blocks_and_exits_143():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert child.returncode == 143
    assert child.stdout == "engine closed\n"
