"""A Hugging Face causal LM as an RLlib ``TorchRLModule``.

RLlib's module API is built for env observations and actions; an LLM policy acts on token ids.
The module therefore takes placeholder gym spaces (RLlib needs some) and works on padded token
batches: ``forward_train`` returns log pi(x_t | x_<t) of every next token.

Weights never pass through RLlib's numpy conversion (it breaks bf16 and copies the whole model):
``get_state`` returns detached torch tensors and ``set_state`` loads them in place. RLlib's own
sync to the EnvRunners gets an empty state; ARPO syncs the weights itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.rl_module.torch import TorchRLModule

from rllib_arpo.core.entropy import entropy_from_logits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def placeholder_spaces(vocab_size: int) -> tuple[gym.Space, gym.Space]:
    """Observation and action spaces for RLlib's bookkeeping: a token id in, a token id out."""
    return gym.spaces.Box(0, vocab_size, shape=(1,), dtype=np.int64), gym.spaces.Discrete(vocab_size)


def next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log pi(x_t | x_<t) for t = 1..L-1 from logits [B, L, V]: result [B, L-1] (float32)."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def load_reference_model(model_config: dict, device) -> torch.nn.Module:
    """The frozen initial policy (for the KL penalty), in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[model_config.get("dtype", "float32")]
    model = AutoModelForCausalLM.from_pretrained(model_config["model_path"], dtype=dtype).to(device).eval()
    return model.requires_grad_(False)


def hf_state_dict(module_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The module keeps the HF model under ``model.``; engines hold the bare HF model."""
    return {k.removeprefix("model."): v for k, v in module_state.items()}


class CausalLMModule(TorchRLModule):
    """``model_config``: ``model_path`` (a ``save_pretrained`` directory), ``dtype``
    (``float32`` | ``bfloat16`` | ``float16``), ``gradient_checkpointing`` (bool)."""

    def setup(self) -> None:
        from transformers import AutoModelForCausalLM

        cfg = self.model_config or {}
        if not cfg.get("model_path"):
            raise ValueError("model_config['model_path'] must name a save_pretrained directory")
        dtype = DTYPES[cfg.get("dtype", "float32")]
        self.model = AutoModelForCausalLM.from_pretrained(cfg["model_path"], dtype=dtype)
        if cfg.get("gradient_checkpointing"):
            self.model.gradient_checkpointing_enable()

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits = self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits
        out = {"logprobs": next_token_logprobs(logits, batch["input_ids"])}
        if kwargs.get("with_entropy"):
            with torch.no_grad():
                out["entropy"] = entropy_from_logits(logits[:, :-1].float())
        return out

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def get_state(self, components=None, *, not_components=None, inference_only=False, **kwargs):
        """The weights as detached CPU tensors; empty for ``inference_only``: that is what RLlib's
        own weight sync to the EnvRunners asks for, and ARPO sends the weights itself (versioned,
        in the engines' dtype, gathered where a backend shards them; ``algorithm.ARPO``)."""
        if inference_only:
            return {}
        return {k: v.detach().cpu() for k, v in self.state_dict().items()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self.load_state_dict(state, strict=True)
