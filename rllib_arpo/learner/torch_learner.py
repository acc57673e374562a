"""ARPOTorchLearner: the policy-gradient update of ARPO, AEPO and the GRPO family.

One ``update`` call trains on a batch of padded trajectory rows (``learner.packing.pad_rows``)
whose advantages were already attributed by the estimator chosen in the config. The policy loss
comes from ``core.losses`` (``config.policy_loss``), taken by ``core.learner_loss``. The batch is
split into micro-batches (``learner.packing.micro_batches``: ``micro_batch_size`` padded rows, or
with ``packing`` ``packed``/``tree`` rows packed into ``micro_batch_tokens`` tokens, shared prefixes laid out once)
whose gradients accumulate, so memory is bounded by the micro-batch while the loss equals the
whole batch's loss: each micro-batch loss is weighted by
its share of the batch's aggregation denominator, as the registered aggregation declares it
(``LossAggregation.row_denominators``: trained tokens for ``token-mean``, sequences with trained
tokens for the ``seq-mean-*`` modes). The accumulated gradients then go through
RLlib's own ``postprocess_gradients`` (``grad_clip`` / ``grad_clip_by``, global norm logged as
``gradients_default_optimizer_global_norm``) and ``apply_gradients``.

With ``num_learners`` >= 2 each learner trains on its shard of the batch and PyTorch DDP
averages their gradients. The denominator is then the *global* batch's (summed over the learners
with one all-reduce) and each learner's loss is multiplied by their number, so the averaged
gradient is exactly the one-learner gradient of the whole batch, not a mean of per-shard means.

Old log-probabilities: ``old_logprob_source: engine`` takes pi_old from the engine that sampled the
tokens; ``learner`` takes the learner's own and keeps the engine's under ``sampler_logprobs`` for
truncated importance sampling (``tis_cap``). Where the update is one pass (one epoch of one
minibatch: no optimizer step before any micro-batch's forward) pi_old is pi_theta itself, so each
micro-batch's training forward gives it (its log-probs, detached) and no other forward is made;
otherwise a forward pass without gradients recomputes them all before the first step.
Either way the update's first minibatch logs how far sampler and learner disagree on the same
tokens (``learner.sampler_mismatch``). Rollouts sampled at a temperature T other than 1 are
trained as softmax(logits / T), the distribution they came from; the engines report
temperature-1 log-probs, so T != 1 needs ``learner`` and logs the ratio's spread only.

The update is five steps a backend may replace (``deepspeed_learner.ARPODeepSpeedLearner`` does):
``_zero_gradients``, ``_micro_batch`` (a context around one micro-batch's forward and backward),
``_forward_train``, ``_backward`` and ``_optimizer_step``.

RLlib has no public hook for the micro-batch loop: it replaces ``TorchLearner._uncompiled_update``
(``rllib_compat.UPDATE_HOOK``). Every RLlib private name goes through ``learner.rllib_compat``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import ray
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from rllib_arpo.core.dtypes import DTYPES
from rllib_arpo.core.learner_loss import compute_policy_loss
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS
from rllib_arpo.learner.checkpoint import rng_states, set_rng_states
from rllib_arpo.learner.distributed import data_parallel_rank, data_parallel_size, global_sum
from rllib_arpo.learner.forward import PACKED, sequence_logprobs
from rllib_arpo.learner.memory import (
    LearnerOutOfMemoryError,
    is_out_of_memory,
    out_of_memory_advice,
    release_freed_memory,
    serve_large_allocations_by_mmap,
)
from rllib_arpo.learner.packing import micro_batches
from rllib_arpo.learner.rl_module import engine_state_dict, load_reference_model
from rllib_arpo.learner.rllib_compat import parameter_gradients, update_batch, update_result, zero_gradients
from rllib_arpo.learner.sampler_mismatch import SAMPLER_LOGPROBS, SamplerMismatch
from rllib_arpo.models.optimizers import build_optimizer
from rllib_arpo.weights.broadcast import WeightBroadcastGroup, WeightLayout, free_address
from rllib_arpo.weights.object_store import tensor_bytes

logger = logging.getLogger(__name__)
RNG_STATES = "rng_states"


class ARPOTorchLearner(TorchLearner):
    def build(self) -> None:
        super().build()
        self._first_pass = True
        self._old_logprobs_from_forward = False
        threshold = self.config.malloc_mmap_threshold
        if self.device.type == "cpu" and threshold is not None and not serve_large_allocations_by_mmap(threshold):
            logger.warning("malloc_mmap_threshold: %d not set (the C library is not glibc)", threshold)
        self._reference_models = {}
        if self.config.kl_coef > 0:  # the initial policy, read again (the module may be wrapped or sharded)
            for mid, module in self.module.items():
                if module.unwrapped().lora is None:  # with LoRA: the base model, adapter off
                    self._reference_models[mid] = load_reference_model(module.unwrapped().model_config, self.device)

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        """AdamW (its moments held as ``optimizer_states`` says) over the trained parameters (with
        LoRA: the adapter's; DDP then all-reduces those only); RLlib sets its learning rate."""
        params = [p for p in self.get_parameters(self.module[module_id]) if p.requires_grad]
        optimizer = build_optimizer(config.optimizer_states, params, lr=0.0, weight_decay=config.weight_decay)
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params, lr_or_lr_schedule=config.lr)

    def policy_weights(self, module_id, *, as_object_ref: bool = False, on_device: bool = False):
        """The module's weights under transformers' names (with LoRA: the adapter's tensors under
        their saved names, ``models.lora``), cast to the engines' ``dtype``, on
        learner rank 0 (None on the others); with ``as_object_ref`` put into the object store, as
        ``(ObjectRef, bytes put)``; on the
        learner's device with ``on_device`` (else in CPU memory). Tensors already in that dtype
        and place are the parameters themselves (no copy): clone them to keep a snapshot."""
        state = self.full_module_state(module_id, on_device=on_device)
        if state is None:
            return None
        lora = self.module[module_id].unwrapped().lora is not None
        engine_state = engine_state_dict(state, lora)
        weights = {name: tensor.to(DTYPES[self.config.dtype]) for name, tensor in engine_state.items()}
        return (ray.put(weights), tensor_bytes(weights)) if as_object_ref else weights

    # --- weight_sync: broadcast (weights.broadcast): rank 0 is the source ------------------
    def weight_group_address(self) -> tuple[str, int, str] | None:
        """On rank 0: (IP address, free port, device type) for the broadcast group; else None."""
        if data_parallel_rank() != 0:
            return None
        return (*free_address(), self.device.type)

    def open_weight_group(self, address: str, port: int, world_size: int, backend: str) -> None:
        if data_parallel_rank() == 0:
            self._weight_group = WeightBroadcastGroup(address, port, 0, world_size, backend)

    def broadcast_weights(self, module_id, layout: WeightLayout) -> None:
        """Every learner calls this (a sharded backend gathers first); rank 0 sends the layout's
        tensors in order."""
        nccl = data_parallel_rank() == 0 and self._weight_group.backend == "nccl"
        weights = self.policy_weights(module_id, on_device=nccl)
        if weights is None:
            return
        layout.check_source(weights)
        for name, _, _ in layout.tensors:
            self._weight_group.broadcast(weights[name].contiguous())

    def full_module_state(self, module_id, *, on_device: bool = False) -> dict[str, torch.Tensor] | None:
        """The module's state dict on learner rank 0 (in CPU memory, or as it is on the learner's
        device with ``on_device``), None on the others (every learner calls this: a sharded
        backend gathers the parameters collectively)."""
        if data_parallel_rank() != 0:
            return None
        module = self.module[module_id]
        if on_device:
            return {name: tensor.detach() for name, tensor in module.unwrapped().trained_state().items()}
        return module.get_state()

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """RLlib's learner state plus the process's random number generator states."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        if components is None:
            state[RNG_STATES] = rng_states()
        return state

    def set_state(self, state: dict) -> None:
        state = dict(state)
        if RNG_STATES in state:
            set_rng_states(state.pop(RNG_STATES))
        super().set_state(state)

    def update(self, batch=None, *, training_data=None, **kwargs):
        """RLlib's ``Learner.update``; with ``old_logprob_source: learner`` each module's ``old_logprobs``
        are first replaced by the learner's own (``_recompute_old_logprobs``), before any
        minibatch or epoch changes the weights."""
        self._first_pass = True  # the first minibatch logs the sampler/learner mismatch
        self._old_logprobs_from_forward = False
        if self.config.old_logprob_source == "learner":
            policy_batches = update_batch(batch, training_data).policy_batches
            rows = {len(module_batch["loss_mask"]) for module_batch in policy_batches.values()}
            one_pass = (
                kwargs.get("num_epochs", 1) == 1
                and not kwargs.get("shuffle_batch_per_epoch", False)
                and kwargs.get("minibatch_size") in (None, *rows)
            )
            for mid, module_batch in policy_batches.items():
                if one_pass:
                    module_batch[SAMPLER_LOGPROBS] = module_batch["old_logprobs"]
                else:
                    self._recompute_old_logprobs(mid, self.config.get_config_for_module(mid), module_batch)
            self._old_logprobs_from_forward = one_pass
        results = super().update(batch=batch, training_data=training_data, **kwargs)
        if self.device.type == "cpu":
            release_freed_memory()  # the update's freed activations, back to the system
        return results

    def _recompute_old_logprobs(self, mid, config, module_batch) -> None:
        """``old_logprobs`` <- log pi_learner of the batch's tokens (micro-batched, no gradient);
        the engine's go to ``SAMPLER_LOGPROBS``."""
        tensors = {
            k: torch.as_tensor(module_batch[k], device=self.device)
            for k in ("input_ids", "attention_mask", "loss_mask")
        }
        learner_logprobs = np.zeros_like(module_batch["old_logprobs"])
        with torch.no_grad():
            for rows, chunk, _ in self._micro_chunks(config, tensors):
                logprobs = self._forward_train(mid, chunk)["logprobs"]
                learner_logprobs[rows.cpu().numpy()] = logprobs.float().cpu().numpy()
        module_batch[SAMPLER_LOGPROBS] = module_batch["old_logprobs"]
        module_batch["old_logprobs"] = learner_logprobs

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        loss, _ = self._policy_loss(module_id, config, batch, fwd_out)
        return loss

    def _reference_logprobs(self, module_id, config, batch) -> torch.Tensor | None:
        """log pi_ref of the batch's tokens for the KL penalty (None without one): the initial
        policy read again, or with LoRA the base model with the adapter off."""
        if config.kl_coef <= 0:
            return None
        if module_id not in self._reference_models:
            return self.module[module_id].unwrapped().base_logprobs(batch)
        with torch.no_grad():
            reference = self._reference_models[module_id]
            ref_logprobs, _ = sequence_logprobs(
                reference, batch, chunk_size=config.logprob_chunk_size, temperature=config.temperature
            )
        return ref_logprobs

    def _policy_loss(self, module_id, config, batch, fwd_out) -> tuple[torch.Tensor, dict]:
        ref_logprobs = self._reference_logprobs(module_id, config, batch)
        return compute_policy_loss(
            config.policy_loss,
            fwd_out["logprobs"],
            batch["old_logprobs"],
            batch["advantages"],
            batch["loss_mask"],
            eps_low=config.clip_eps_low,
            eps_high=config.clip_eps_high,
            dual_clip=config.dual_clip,
            agg_mode=config.loss_agg_mode,
            token_sum_norm=config.token_sum_norm,
            ref_logprobs=ref_logprobs,
            kl_coef=config.kl_coef,
            kl_kind=config.kl_kind,
            sampler_logprobs=batch.get(SAMPLER_LOGPROBS),
            tis_cap=config.tis_cap,
        )

    def _uncompiled_update(self, batch: dict, **kwargs):  # rllib_compat.UPDATE_HOOK
        """RLlib's update step (``TorchLearner._update`` dispatches here), with the single
        forward/backward replaced by ``_accumulate_gradients`` over micro-batches."""
        if self._old_logprobs_from_forward and not self._first_pass:
            raise RuntimeError("pi_old was taken from the training forward, but the update makes a second pass")
        self._zero_gradients()
        loss_per_module = {}
        for mid, module_batch in batch.items():
            config = self.config.get_config_for_module(mid)
            try:
                loss_per_module[mid] = self._accumulate_gradients(mid, config, module_batch)
            except RuntimeError as error:
                if not is_out_of_memory(error):
                    raise
                rows = min(config.micro_batch_size, module_batch["input_ids"].shape[0])
                advice = out_of_memory_advice(config, rows, module_batch["input_ids"].shape[1])
                raise LearnerOutOfMemoryError(advice) from error
        self._optimizer_step(loss_per_module)
        return update_result(loss_per_module)

    def _finite(self, loss_per_module: dict, gradients: dict) -> bool:
        """False (and the step skipped, counted as ``nonfinite_steps_skipped``) when a loss or a
        gradient is NaN or inf; raises after ``max_consecutive_nonfinite_steps`` such steps in a row."""
        values = [*loss_per_module.values(), *(g for g in gradients.values() if g is not None)]
        finite = all(bool(torch.isfinite(value).all()) for value in values)
        self._nonfinite_in_a_row = 0 if finite else getattr(self, "_nonfinite_in_a_row", 0) + 1
        self.metrics.log_value("nonfinite_steps_skipped", int(not finite), reduce="sum")
        if not finite:
            limit = self.config.max_consecutive_nonfinite_steps
            if self._nonfinite_in_a_row >= limit:
                raise FloatingPointError(
                    f"{self._nonfinite_in_a_row} updates in a row had a NaN or inf loss or gradient "
                    f"(max_consecutive_nonfinite_steps: {limit}); lower lr, check the rewards and advantages"
                )
            logger.warning("update skipped: a NaN or inf loss or gradient (%d in a row)", self._nonfinite_in_a_row)
        return finite

    # --- the steps a learner backend replaces ---------------------------------------------
    def _zero_gradients(self) -> None:
        zero_gradients(self)

    def _micro_batch(self, mid, last: bool):
        """Context of one micro-batch's forward and backward: DDP all-reduces the gradients on
        the last micro-batch only."""
        module = self.module[mid]
        return module.no_sync() if not last and hasattr(module, "no_sync") else contextlib.nullcontext()

    def _forward_train(self, mid, batch: dict[str, Any]) -> dict[str, Any]:
        return self.module[mid].forward_train(batch)

    def _backward(self, mid, loss: torch.Tensor) -> None:
        loss.backward()

    def _optimizer_step(self, loss_per_module: dict) -> None:
        """RLlib's gradient clipping (``grad_clip``, ``grad_clip_by``) and optimizer step, skipped
        when a loss or a gradient is not finite (``_finite``); then the gradients are freed, so that
        they do not stay resident through the next rollout (SmolLM2-135M: 0.5 GiB of float32)."""
        gradients = parameter_gradients(self)
        if self._finite(loss_per_module, gradients):
            self.apply_gradients(self.postprocess_gradients(gradients))
        zero_gradients(self)

    def _micro_chunks(self, config, module_batch: dict[str, Any]):
        """``(rows, chunk, last)`` per micro-batch of ``module_batch`` (``packing.micro_batches``):
        the rows' indices, their entries (the packed layout under ``PACKED``), and whether it is
        the last; each chunk is gathered only when its turn comes."""
        micros = micro_batches(
            *(module_batch[k].cpu().numpy() for k in ("input_ids", "attention_mask", "loss_mask")),
            packing=config.packing,
            micro_batch_size=config.micro_batch_size,
            micro_batch_tokens=config.micro_batch_tokens,
            attention_block_tokens=config.attention_block_tokens,
        )
        for i, (rows, packed) in enumerate(micros):
            rows = torch.as_tensor(rows, device=self.device)
            chunk = {k: v[rows] for k, v in module_batch.items()}
            if packed is not None:
                chunk[PACKED] = packed
            yield rows, chunk, i == len(micros) - 1

    def _accumulate_gradients(self, mid, config, module_batch: dict[str, Any]) -> torch.Tensor:
        """Forward and backward over micro-batches; returns the batch loss (this learner's share).

        Micro-batch c of this learner's shard is weighted by W * n_c / n, n_c its rows' share of
        the denominator, n the denominator summed over all W learners: the W learners'
        averaged gradient is then the gradient of the global batch's loss."""
        denominators = LOSS_AGGREGATIONS.get(config.loss_agg_mode).row_denominators(module_batch["loss_mask"])
        total = global_sum(denominators.sum().float()).clamp_min(1)
        scale = data_parallel_size() / total
        # at a temperature other than 1 the engines' log-probs are of another distribution
        mismatch = SamplerMismatch(with_sampler=config.temperature == 1.0) if self._first_pass else None
        batch_loss = torch.zeros((), device=self.device)
        weighted_metrics: dict[str, float] = {}
        for rows, chunk, last in self._micro_chunks(config, module_batch):
            share = denominators[rows].sum().float() * scale
            with self._micro_batch(mid, last=last):
                fwd_out = self._forward_train(mid, chunk)
                if self._old_logprobs_from_forward:  # pi_old = pi_theta before the only step
                    chunk["old_logprobs"] = fwd_out["logprobs"].detach()
                loss, metrics = self._policy_loss(mid, config, chunk, fwd_out)
                self._backward(mid, loss * share)
            if mismatch is not None:
                mismatch.add(fwd_out["logprobs"].detach(), chunk)
            batch_loss += loss.detach() * share
            for key, value in metrics.items():
                weighted_metrics[key] = weighted_metrics.get(key, 0.0) + value * float(share)
        if mismatch is not None:
            weighted_metrics.update(mismatch.metrics())
            self._first_pass = False
        for key, value in weighted_metrics.items():
            self.metrics.log_value((mid, key), value, window=1)
        return batch_loss
