"""ARPO's math: rollout trees, entropy, branching, advantages, losses, and the scoring of answers
(the final answer, its correctness, the TIR format check; the rewards built on them: ``rllib_arpo.rewards``).
With the small modules every side needs: the registries' one class (``registry``), settings,
calls under a time limit (``time_limit``) and the import of the user's modules and of what a
config names as ``module:attribute`` (``user_imports``).

Pure numpy / torch: nothing here imports Ray, transformers or any model object.
"""
