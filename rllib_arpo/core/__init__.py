"""ARPO's math: rollout trees, entropy, branching, advantages, losses and rewards.

Pure numpy / torch: nothing here imports Ray, transformers or any model object.
"""
