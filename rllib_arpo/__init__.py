"""rllib-arpo: Agentic Reinforced Policy Optimization (ARPO, AEPO, GRPO family) on Ray RLlib.

``from rllib_arpo import ARPOConfig`` (or ``import rllib_arpo.algorithm``) registers the
``"ARPO"`` trainable with Ray Tune. The math in ``rllib_arpo.core`` imports without Ray, so this
package loads the RLlib parts only when one of them is first asked for.
"""

__version__ = "0.1.0"
__all__ = ["ARPO", "ARPOConfig"]


def __getattr__(name: str):
    if name in __all__:
        from rllib_arpo import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module 'rllib_arpo' has no attribute {name!r}")
