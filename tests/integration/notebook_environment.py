"""A user's environment for the integration tests, in a module of its own (an isolated instance's
process imports its class's module): ``Notebook`` keeps the cells the policy's ``<python>`` actions
wrote and answers each with how many it holds. It refuses to reset in the process that imported its
module: an isolated instance's process is forked from the server that imported it, while an
instance in the EnvRunner's own process would run where the module was imported."""

from __future__ import annotations

import copy
import os

IMPORTED_BY = os.getpid()


class Notebook:
    action_tag = "python"
    deterministic = False  # forks clone: a replay would be refused for a non-deterministic class

    def reset(self, row):
        if os.getpid() == IMPORTED_BY:
            raise RuntimeError("not isolated: reset in the process that imported the class")
        self.cells = []
        return ""

    def step(self, action):
        self.cells.append(action)
        return f"cell {len(self.cells)} kept", 0.0, False, {}

    def clone(self):
        return copy.deepcopy(self)
