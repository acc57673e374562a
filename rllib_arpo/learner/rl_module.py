"""A Hugging Face causal LM as an RLlib ``TorchRLModule``.

RLlib's module API is built for env observations and actions; an LLM policy acts on token ids.
The module therefore takes placeholder gym spaces (RLlib needs some; ``rllib_arpo.models.spaces``) and
works on token batches: ``forward_train`` returns log pi(x_t | x_<t) of every next token
(``learner.forward.sequence_logprobs``: padded rows or a packed layout).

Weights never pass through RLlib's numpy conversion (it breaks bf16 and copies the whole model):
``get_state`` returns detached torch tensors and ``set_state`` loads them in place. RLlib's own
sync to the EnvRunners gets an empty state; ARPO syncs the weights itself.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from ray.rllib.core.rl_module.torch import TorchRLModule

from rllib_arpo.core.dtypes import DTYPES
from rllib_arpo.learner.checkpoint import WEIGHTS_FILE, load_weights, save_weights
from rllib_arpo.learner.forward import sequence_logprobs
from rllib_arpo.learner.packed_forward import use_block_attention
from rllib_arpo.learner.packing import PACKING_MODES
from rllib_arpo.models.catalogue import check_model_path
from rllib_arpo.models.lora import LoraSettings, adapters_disabled, add_lora, saved_name

MODEL_CONFIG_KEYS = (
    "model_path",
    "dtype",
    "master_weights",
    "gradient_checkpointing",
    "logprob_chunk_size",
    "packing",
    "temperature",
    "lora",
)
"""The config fields ``ARPOConfig`` puts into the module's ``model_config`` (``CausalLMModule``)."""


def check_model_config(model_config: dict | None) -> dict:
    """``model_config`` when it holds every key of ``MODEL_CONFIG_KEYS`` (their defaults are the
    config's, not restated here); else a ValueError naming the missing ones."""
    missing = [key for key in MODEL_CONFIG_KEYS if key not in (model_config or {})]
    if missing:
        raise ValueError(f"the module's model_config lacks {missing} (ARPOConfig sets {list(MODEL_CONFIG_KEYS)})")
    return model_config


def load_reference_model(model_config: dict, device) -> torch.nn.Module:
    """The frozen initial policy (for the KL penalty), in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[check_model_config(model_config)["dtype"]]
    model = AutoModelForCausalLM.from_pretrained(model_config["model_path"], dtype=dtype).to(device).eval()
    _attend_in_blocks_if_packed(model, model_config)
    return model.requires_grad_(False)


def _attend_in_blocks_if_packed(model: torch.nn.Module, model_config: dict) -> None:
    """Packed micro-batches attend block by block (``packed_forward.use_block_attention``)."""
    if PACKING_MODES.get(model_config["packing"]).packs:
        use_block_attention(model)


def hf_state_dict(module_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The module keeps the HF model under ``model.``; engines hold the bare HF model."""
    return {k.removeprefix("model."): v for k, v in module_state.items()}


def engine_state_dict(module_state: dict[str, torch.Tensor], lora: bool) -> dict[str, torch.Tensor]:
    """What the engines load: the HF model's weights (``hf_state_dict``), or with ``lora`` the
    adapter's tensors under their saved names (``models.lora``)."""
    weights = hf_state_dict(module_state)
    return {saved_name(name): t for name, t in weights.items()} if lora else weights


class CausalLMModule(TorchRLModule):
    """``model_config`` (``MODEL_CONFIG_KEYS``, every one required): ``model_path`` (a
    ``save_pretrained`` directory), ``dtype`` (the compute
    dtype: ``float32`` | ``bfloat16`` | ``float16``), ``master_weights`` (keep the weights in
    float32 and compute in ``dtype`` under autocast), ``gradient_checkpointing`` (recompute each
    layer's activations in the backward pass), ``logprob_chunk_size`` (``sequence_logprobs``),
    ``packing`` (a mode that packs rows: block-sparse attention for packed micro-batches),
    ``temperature`` (the rollouts' sampling temperature: log-probs of softmax(logits / T)),
    ``lora`` (a ``LoraSettings`` entry or None: with it the base weights are frozen in ``dtype``
    and only the adapter is trained, in float32 with ``master_weights``; the state is the
    adapter's alone)."""

    def setup(self) -> None:
        from transformers import AutoModelForCausalLM

        cfg = check_model_config(self.model_config)
        check_model_path(cfg["model_path"])
        self.compute_dtype = DTYPES[cfg["dtype"]]
        self.lora = LoraSettings.from_config(cfg["lora"])
        trained_dtype = torch.float32 if cfg["master_weights"] else self.compute_dtype
        base_dtype = trained_dtype if self.lora is None else self.compute_dtype  # a frozen base needs no master copy
        self.model = AutoModelForCausalLM.from_pretrained(cfg["model_path"], dtype=base_dtype)
        if self.lora is not None:
            add_lora(self.model, self.lora, adapter_dtype=trained_dtype)
        if cfg["gradient_checkpointing"]:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _attend_in_blocks_if_packed(self.model, cfg)
        self.logprob_chunk_size = cfg["logprob_chunk_size"]
        self.temperature = cfg["temperature"]

    def _autocast(self):
        """Autocast to the compute dtype while weights are kept in another (float32 master
        weights, a float32 adapter); nothing where all are already in it (DeepSpeed casts them itself)."""
        if all(p.dtype == self.compute_dtype for p in self.model.parameters()):
            return contextlib.nullcontext()
        return torch.autocast(device_type=next(self.model.parameters()).device.type, dtype=self.compute_dtype)

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        with self._autocast():
            logprobs, entropy = sequence_logprobs(
                self.model,
                batch,
                chunk_size=self.logprob_chunk_size,
                with_entropy=kwargs.get("with_entropy", False),
                temperature=self.temperature,
            )
        return {"logprobs": logprobs} if entropy is None else {"logprobs": logprobs, "entropy": entropy}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def base_logprobs(self, batch: dict[str, Any]) -> torch.Tensor:
        """With LoRA: log pi_base of the batch's tokens, the adapter off (the KL reference without
        a second copy of the base weights); no gradient."""
        with torch.no_grad(), adapters_disabled(self.model):
            return self._forward(batch)["logprobs"]

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The state dict, without the frozen base weights under LoRA (they are ``model_path``'s)."""
        state = self.state_dict()
        return state if self.lora is None else {k: v for k, v in state.items() if ".lora_" in k}

    def get_state(self, components=None, *, not_components=None, inference_only=False, **kwargs):
        """The trained weights (with LoRA: the adapter's) as detached CPU tensors; empty for
        ``inference_only``: that is what RLlib's own weight sync to the EnvRunners asks for, and
        ARPO sends the weights itself (versioned, in the engines' dtype, gathered where a backend
        shards them; ``algorithm.ARPO``)."""
        if inference_only:
            return {}
        return {k: v.detach().cpu() for k, v in self.trained_state().items()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load what ``get_state`` gives: every trained tensor, nothing else."""
        if self.lora is None:
            self.load_state_dict(state, strict=True)
            return
        expected = set(self.trained_state())
        if set(state) != expected:
            missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(f"a LoRA module's state must be its adapter: missing {missing[:3]}, unknown {unknown[:3]}")
        self.load_state_dict(state, strict=False)

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint of the module, the weights written as safetensors (``model.safetensors``,
        in the learner's own dtype) instead of a pickle."""
        weights = state if state is not None else self.get_state()
        marker = {"weights_file": WEIGHTS_FILE}
        path = super().save_to_path(path, state=marker, filesystem=filesystem, use_msgpack=use_msgpack)
        save_weights(weights, Path(path) / WEIGHTS_FILE)
        return path

    def restore_from_path(self, path, *, component=None, filesystem=None, **kwargs) -> None:
        self.set_state(load_weights(Path(path) / WEIGHTS_FILE))
