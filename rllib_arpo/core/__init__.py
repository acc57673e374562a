"""ARPO's math: rollout trees, entropy, branching, advantages, losses, and the scoring of answers
(the final answer, its correctness, the TIR format check; the rewards built on them: ``rllib_arpo.rewards``).

Pure numpy / torch: nothing here imports Ray, transformers or any model object.
"""
