"""rllib-arpo: Agentic Reinforced Policy Optimization (ARPO, AEPO, GRPO family) on Ray RLlib.

``import rllib_arpo`` registers the family's trainables with Ray Tune under their names
(``ARPO``, ``AEPO``, ``GRPO``, ``DAPO``, ``REINFORCE++``, ``LOOP``, ``DrGRPO``, ``GPPO``,
``CISPO``; ``family.FAMILY``), so ``tune.Tuner("GRPO", param_space=...)`` works after it.

The math in ``rllib_arpo.core`` imports without Ray, so this package does not import RLlib
itself: the registration runs as soon as ``ray.rllib`` is imported (at once if it already is),
which Tune does when it looks up a trainable name it does not know. When ``ray.rllib`` is first
loaded by one of this package's own modules (a Ray worker unpickling an EnvRunner), the
registration is left to ``rllib_arpo.algorithm``, which registers the trainables whenever it is
imported. ``ARPO`` and ``ARPOConfig`` load the RLlib parts when first asked for.
"""

import sys

import wrapt

__version__ = "0.1.0"
__all__ = ["ARPO", "ARPOConfig"]


def _register_with_tune(_rllib_module) -> None:
    """Import ``rllib_arpo.algorithm`` (it registers the trainables as it loads), unless one of
    our modules is still loading: importing the algorithm from inside it would be circular."""
    loading = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("rllib_arpo.") and getattr(getattr(module, "__spec__", None), "_initializing", False)
    ]
    if not loading:
        import rllib_arpo.algorithm  # noqa: F401


def __getattr__(name: str):
    if name in __all__:
        from rllib_arpo import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module 'rllib_arpo' has no attribute {name!r}")


wrapt.register_post_import_hook(_register_with_tune, "ray.rllib")
