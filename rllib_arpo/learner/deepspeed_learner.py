"""ARPODeepSpeedLearner: the ARPO update on a DeepSpeed ZeRO engine (``learner_backend: deepspeed``).

RLlib knows PyTorch DDP only. This learner keeps everything of ``ARPOTorchLearner`` (the loss,
the micro-batch loop, the global token mean over learners) and replaces the three places where
DDP and the optimizer act:

- wrapping: instead of RLlib's DDP wrapper (``rllib_compat.DATA_PARALLEL_HOOK``), each module
  goes into ``deepspeed.initialize`` with the AdamW optimizer RLlib registered (in bf16 or fp16
  its float32 master weights are then set to the weights as loaded, not their rounding); ZeRO stage 1
  partitions the optimizer states over the learners, 2 the gradients too, 3 the parameters too
  (``zero_stage``), optionally kept in CPU memory (``zero_offload``);
- backward: ``engine.backward`` (ZeRO reduces and partitions the gradients as they are made),
  with the gradient-accumulation boundary set on the last micro-batch only;
- step: ``engine.step`` (gradient clipping at ``grad_clip`` by global norm, optimizer step).

Processes: the learners' process group (RLlib's, gloo on CPU, NCCL on GPU) is DeepSpeed's too; a
local learner (``num_learners: 0``) gets a one-process group. On a machine without a GPU,
``DS_ACCELERATOR=cpu`` is set before DeepSpeed is imported, and DeepSpeed's shared-memory
communication op is marked unavailable: it serves inference all-reduces only, its just-in-time
build and load at each learner start took the learner tests from 43 s to 75 s, and a build lock
that a killed build left behind hung every later start.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

import torch
import torch.distributed as dist
from ray.rllib.core import COMPONENT_OPTIMIZER

from rllib_arpo.learner.torch_learner import ARPOTorchLearner

NEVER = 2**31 - 1


def deepspeed_config(config: Any) -> dict:
    """The DeepSpeed config of the learner: ``micro_batch_size``, ``grad_clip``, ``dtype``,
    ``zero_stage``, ``zero_offload``, then ``deepspeed_config`` merged over it."""
    if config.grad_clip is not None and config.grad_clip_by != "global_norm":
        raise ValueError(
            f"learner_backend deepspeed clips by global norm only; got grad_clip_by={config.grad_clip_by!r}"
        )
    zero: dict[str, Any] = {"stage": config.zero_stage}
    if config.zero_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if config.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    generated = {
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": 1,  # the learner sets the accumulation boundary itself
        "gradient_clipping": float(config.grad_clip or 0.0),
        "zero_optimization": zero,
        "bf16": {"enabled": config.dtype == "bfloat16"},
        "fp16": {"enabled": config.dtype == "float16"},
        # RLlib's AdamW (its learning-rate schedule included) is the client optimizer
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": NEVER,
    }
    return _merged(generated, config.deepspeed_config)


def _merged(base: dict, overrides: dict) -> dict:
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def import_deepspeed():
    """``import deepspeed`` with its accelerator picked first (CPU where there is no GPU), without
    its CPU shared-memory op (see the module docstring)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(
            "learner_backend: deepspeed needs the deepspeed package: pip install -e '.[deepspeed]'"
        ) from error
    if os.environ["DS_ACCELERATOR"] == "cpu":
        shared_memory_op = deepspeed.accelerator.get_accelerator().get_op_builder("ShareMemCommBuilder")
        deepspeed.ops.__compatible_ops__[shared_memory_op.NAME] = False  # DeepSpeed keeps this dict
    return deepspeed


def _ensure_process_group(device: torch.device) -> None:
    """DeepSpeed runs on a process group; a local learner gets one of its own (world size 1)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    # a learner actor sees its own GPU only, as device 0
    os.environ.setdefault("LOCAL_RANK", "0")


def _float32_weights_to_keep(module: torch.nn.Module, config: dict) -> dict[str, torch.Tensor]:
    """The module's float32 weights (copies in CPU memory) where DeepSpeed will cast it to bf16 or
    fp16 (``config``): it makes its float32 master weights from the cast ones, so the weights as
    loaded would be lost to rounding (2^-9 relative in bf16, at lr 1e-6 hundreds of updates' worth).
    Empty where nothing would be lost."""
    if not (config["bf16"]["enabled"] or config["fp16"]["enabled"]):
        return {}
    return {
        name: parameter.detach().to("cpu", copy=True)
        for name, parameter in module.named_parameters()
        if parameter.requires_grad and parameter.dtype == torch.float32
    }


def _set_master_weights(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """DeepSpeed's float32 master weights set to ``weights`` (``_float32_weights_to_keep``), so the
    update starts from the weights loaded, as the torch learner's does."""
    from deepspeed.utils import safe_set_full_fp32_param

    for name, parameter in module.named_parameters():
        if name in weights:
            safe_set_full_fp32_param(parameter, weights[name])


class ARPODeepSpeedLearner(ARPOTorchLearner):
    def _make_modules_ddp_if_necessary(self) -> None:  # rllib_compat.DATA_PARALLEL_HOOK
        """Build one DeepSpeed engine per module (instead of RLlib's DDP wrapper)."""
        deepspeed = import_deepspeed()
        _ensure_process_group(self.device)
        self._engines = {}
        for mid, module in self.module.items():
            [(_, optimizer)] = self.get_optimizers_for_module(mid)
            config = deepspeed_config(self.config.get_config_for_module(mid))
            loaded = _float32_weights_to_keep(module, config)
            engine, *_ = deepspeed.initialize(
                model=module, optimizer=optimizer, config=config, dist_init_required=False
            )
            _set_master_weights(module, loaded)
            self._engines[mid] = engine

    @property
    def engines(self) -> dict:
        """ModuleID -> its DeepSpeed engine."""
        return self._engines

    def _zero_gradients(self) -> None:
        for engine in self._engines.values():
            engine.zero_grad()

    def _micro_batch(self, mid, last: bool):
        self._engines[mid].set_gradient_accumulation_boundary(last)
        return contextlib.nullcontext()

    def _forward_train(self, mid, batch: dict[str, Any]) -> dict[str, Any]:
        # through the engine: ZeRO-3 gathers the partitioned parameters around its forward
        return self._engines[mid](batch)

    def _backward(self, mid, loss: torch.Tensor) -> None:
        # the loss already carries its micro-batch weight: no division by accumulation steps
        self._engines[mid].backward(loss, scale_wrt_gas=False)

    def _optimizer_step(self, loss_per_module: dict) -> None:
        """``engine.step`` (clipping included); skipped when a loss is not finite (the gradients
        are DeepSpeed's, partitioned: their finiteness is not checked here)."""
        if not self._finite(loss_per_module, {}):
            return
        for mid, engine in self._engines.items():
            engine.step()
            norm = engine.get_global_grad_norm()
            if norm is not None:
                self.metrics.log_value((mid, "gradients_default_optimizer_global_norm"), float(norm), window=1)

    def full_module_state(self, module_id, *, on_device: bool = False) -> dict[str, torch.Tensor] | None:
        """ZeRO-3 partitions the parameters: every learner takes part in gathering them."""
        if self.config.zero_stage != 3:
            return super().full_module_state(module_id, on_device=on_device)
        module = self.module[module_id]
        with import_deepspeed().zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            state = super().full_module_state(module_id, on_device=on_device)
            # copies: the gathered tensors are freed when the parameters are partitioned again
            return None if state is None else {name: tensor.clone() for name, tensor in state.items()}

    # --- checkpoints: DeepSpeed's own, every learner writing its partitions ----------------
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """RLlib's learner state without the optimizer: it lives in the DeepSpeed checkpoint
        (``save_engines``), partitioned over the learners."""
        excluded = [not_components] if isinstance(not_components, str) else list(not_components or [])
        return super().get_state(components, not_components=[*excluded, COMPONENT_OPTIMIZER], **kwargs)

    def set_state(self, state: dict) -> None:
        super().set_state({k: v for k, v in state.items() if k != COMPONENT_OPTIMIZER})

    def save_engines(self, directory: str) -> None:
        """Every learner calls this together: each writes its ZeRO partitions (weights, float32
        master weights, optimizer states) under ``directory``."""
        for mid, engine in self._engines.items():
            engine.save_checkpoint(directory, tag=str(mid))

    def load_engines(self, directory: str) -> None:
        """Every learner calls this together, on a checkpoint of the same number of learners."""
        for mid, engine in self._engines.items():
            path, _ = engine.load_checkpoint(directory, tag=str(mid))
            if path is None:
                raise FileNotFoundError(f"no DeepSpeed checkpoint of module {mid!r} under {directory}")
