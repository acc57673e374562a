"""The initial policy, frozen, for REINFORCE++'s KL in the reward.

REINFORCE++ (arXiv 2501.03262) folds the KL to the initial (reference) policy into the reward:
every response token s of a trajectory costs kl_s = log pi_old(y_s) - log pi_ref(y_s) (the k1
estimate; pi_old is the sampling policy, whose logprobs the engine returns), and the return of
token t is r - reward_kl_coef * sum_{s >= t} kl_s (``core.advantages.reinforce_pp``). The
EnvRunner keeps a ``ReferencePolicy`` when ``reward_kl_coef`` > 0 and measures kl for every full
row of every tree; tool-result tokens (not the policy's) get kl = 0.
"""

from __future__ import annotations

import numpy as np
import torch

from rllib_arpo.core.logprobs import next_token_logprobs
from rllib_arpo.core.tree import RolloutTree


class ReferencePolicy:
    """A frozen causal LM: log pi_ref of given tokens."""

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
        self.model.requires_grad_(False)

    @torch.inference_mode()
    def token_kl(self, tree: RolloutTree) -> list[np.ndarray]:
        """kl_s = (log pi_old - log pi_ref)(y_s) of every response token of every full row of
        ``tree`` (0 on tool results), one array per trajectory, aligned with its response."""
        out = []
        for row in tree.to_rows():
            ids = torch.from_numpy(np.concatenate([row.prompt_ids, row.response_ids]))[None]
            logprobs = next_token_logprobs(self.model(input_ids=ids).logits, ids)[0, row.prompt_ids.size - 1 :]
            out.append(((row.old_logprobs - logprobs.numpy()) * row.loss_mask).astype(np.float32))
        return out
