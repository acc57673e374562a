"""The vLLM side of ``weight_sync: broadcast``: mixed into every vLLM worker process
(``worker_extension_cls``), it joins the broadcast group and streams each sync's tensors into
vLLM's own in-place reload (the worker's ``reload_weights``), on CPU and on GPUs alike.

Why the reload and not ``model.load_weights``: vLLM post-processes weights after loading (its CPU
backend repacks linear layers for its GEMM kernels, quantised layers are converted), so loading
checkpoint tensors straight into the processed parameters is wrong. ``reload_weights`` puts every
layer back into checkpoint form, feeds the checkpoint-format tensors through the model's
``load_weights`` (which fuses q/k/v and gate/up and shards for tensor parallelism), and as soon as
all of one layer's tensors have arrived runs that layer's ``process_weights_after_loading`` and
copies the result into the layer's original storage. The received tensors are handed to it one at
a time, as they come off the wire, in the layout's order (sorted names: each layer's tensors
together), so the extra memory is about one layer's weights, never a second copy of the model.
A tied tensor is received once and handed on under each of its names (the embedding's as the
output layer's too): only a module that is loaded is processed again, and vLLM's CPU backend keeps
a repacked copy of the tied weight in the output layer.

The backend is the group's (``weights.broadcast.open_broadcast_group``): gloo for CPU tensors, NCCL
where the learner and every engine hold CUDA tensors; each tensor is received on the worker's
device. Tested on vLLM's CPU build with gloo (tests/vllm); the NCCL path runs in
``rllib check-gpu``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rllib_arpo.weights.broadcast import WeightBroadcastGroup, WeightLayout


class WeightReceiver:
    """Methods vLLM adds to its worker class; ``self`` is the worker (``self.vllm_config``,
    ``self.device``, ``self.rank``, ``self.reload_weights``)."""

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str) -> tuple:
        """Join as ``rank`` + this worker's tensor-parallel rank; return the layout's tensors
        (``WeightLayout.tensors``: plain values, as vLLM sends answers back serialised). The layout
        is the transformers model's (vLLM's own parameters are fused and renamed), built on the
        meta device from the config vLLM loaded (``model_config.model`` may point at a deleted
        reload directory)."""
        from transformers import AutoModelForCausalLM

        model_config = self.vllm_config.model_config
        with torch.device("meta"):
            hf_model = AutoModelForCausalLM.from_config(model_config.hf_config)
        self._weight_layout = WeightLayout.of_model(hf_model, dtype=model_config.dtype)
        names_of: dict[int, list[str]] = {}  # each parameter's names: a tied one has several
        for name, param in hf_model.named_parameters(remove_duplicate=False):
            names_of.setdefault(id(param), []).append(name)
        self._weight_names = {names[0]: names for names in names_of.values()}  # the layout's name first
        self._weight_group = WeightBroadcastGroup(address, port, rank + self.rank, world_size, backend)
        return self._weight_layout.tensors

    def receive_weights(self) -> None:
        """Receive one sync and load it in place (see the module docstring)."""
        self.reload_weights(weights_iterator=self._received_tensors())

    def _received_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor of the layout, in order, as it arrives from rank 0, under each of its names."""
        for name, shape, dtype in self._weight_layout.tensors:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self._weight_group.broadcast(tensor)
            for alias in self._weight_names[name]:
                yield alias, tensor
