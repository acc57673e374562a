"""rllib-arpo: Agentic Reinforced Policy Optimization (ARPO, AEPO, GRPO family) on Ray RLlib."""

__version__ = "0.1.0"
