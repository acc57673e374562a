"""The gym spaces RLlib asks for, given to a policy that reads and writes token ids.

RLlib builds EnvRunners and learners for env observations and actions, and builds the module
from spaces: the EnvRunner reports these (``get_spaces``), and code that builds a learner outside
an algorithm (``gpu_check``, the learner benchmark) passes them. A module of its own, below
``rollout`` and ``learner``, so that neither imports the other for it; not in ``core``, which
holds math only and does not load gymnasium.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def placeholder_spaces(vocab_size: int) -> tuple[gym.Space, gym.Space]:
    """Observation and action spaces for RLlib's bookkeeping: a token id in, a token id out."""
    return gym.spaces.Box(0, vocab_size, shape=(1,), dtype=np.int64), gym.spaces.Discrete(vocab_size)
