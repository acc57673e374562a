"""Environment classes of the environment tests, in a module that imports only numpy: the
process of an isolated instance (``environments.isolated``) imports its class's module, and a
test module imports the whole rollout.

``Walk`` is a small deterministic environment with hidden random state: a position that each
action moves by its number plus a draw of the instance's own generator, seeded by the row.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import numpy as np

HANG_S = 3600.0
"""How long a hang of these classes sleeps: a test that returns within ``HANG_S / 60`` (60 s, far
beyond any process start and kill on a loaded machine) cut the hang off rather than waited."""


class Walk:
    """Position 0 at reset; ``step("k")`` moves by k + a draw in {0, 1, 2} of a generator seeded by
    the row's ``seed``; observation ``"at <position>"``; reward 1 and done on reaching ``goal``."""

    action_tag = "move"
    deterministic = True

    def __init__(self, goal: int = 100):
        self.goal = goal

    def reset(self, row):
        seed = row.get("seed", 0)
        self.position, self.rng = 0, np.random.default_rng(seed)
        return f"start {seed}"

    def step(self, action):
        self.position += int(action) + int(self.rng.integers(0, 3))
        done = self.position >= self.goal
        return f"at {self.position}", float(done), done, {}


class ClonableWalk(Walk):
    def clone(self):
        return copy.deepcopy(self)


class Crashing(ClonableWalk):
    """Walks, but where the row's ``fault`` says so its steps raise a KeyError (``raises``), sleep an
    hour (``hangs``) or end the process (``exits``: ``os._exit(0)``), or its reset sleeps an hour
    (``hangs_at_reset``); the constructor's ``fault`` is that of a row without one."""

    def __init__(self, fault: str | None = None):
        super().__init__()
        self.fault = fault

    def reset(self, row):
        self.fault = row.get("fault", self.fault)
        if self.fault == "hangs_at_reset":
            time.sleep(HANG_S)
        return super().reset(row)

    def step(self, action):
        if self.fault == "raises":
            raise KeyError("treasure")
        if self.fault == "hangs":
            time.sleep(HANG_S)
        if self.fault == "exits":
            os._exit(0)
        return super().step(action)


class BuildsForever(Walk):
    """Its constructor sleeps an hour."""

    def __init__(self):
        super().__init__()
        time.sleep(HANG_S)


class Locked(ClonableWalk):
    """Clonable in process (a deep copy shares nothing it cannot), but holds a lock, which does not pickle."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def clone(self):
        twin = copy.copy(self)
        twin.lock = threading.Lock()
        return twin
