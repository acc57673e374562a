"""`rllib evaluate` turns SIGTERM into SystemExit, so its engine is shut down in a `finally`; a
caller of ``main`` gets its own handler back afterwards."""

import signal
import subprocess
import sys

from rllib_arpo.cli import exit_on_sigterm

CHILD = """
import os, signal, time
from rllib_arpo.cli import exit_on_sigterm
with exit_on_sigterm():
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


def test_the_handler_before_the_block_is_restored_after_it():
    before = signal.getsignal(signal.SIGTERM)
    with exit_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
