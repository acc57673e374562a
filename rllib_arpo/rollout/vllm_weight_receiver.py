"""The vLLM side of ``weight_sync: broadcast``: mixed into every vLLM worker process
(``worker_extension_cls``), it joins the broadcast group and loads each sync's tensors with
vLLM's own ``load_weights``, which fuses and shards them as the model needs.

NOT RUN HERE: this machine has no GPU, and vLLM's CPU backend cannot load weights in place (it
repacks linear layers; ``weight_sync: broadcast`` with ``engine: vllm`` is refused without CUDA).
It follows the protocol of ``learner.weight_broadcast``, which is tested on CPU with HF engines.
"""

from __future__ import annotations

import torch

from rllib_arpo.learner.weight_broadcast import WeightBroadcastGroup, WeightLayout

LOAD_BUCKET_BYTES = 1 << 30  # load received tensors a GB at a time: bounded extra GPU memory


class WeightReceiver:
    """Methods vLLM adds to its worker class; ``self`` is the worker (``self.vllm_config``,
    ``self.device``, ``self.rank``, ``self.model_runner``)."""

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str) -> WeightLayout:
        """Join as ``rank`` + this worker's tensor-parallel rank; the layout is the transformers
        model's (vLLM's own parameters are fused and renamed), built on the meta device."""
        from transformers import AutoConfig, AutoModelForCausalLM

        model_config = self.vllm_config.model_config
        with torch.device("meta"):
            hf_model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_config.model))
        self._weight_layout = WeightLayout.of_model(hf_model, dtype=model_config.dtype)
        self._weight_group = WeightBroadcastGroup(address, port, rank + self.rank, world_size, backend)
        return self._weight_layout

    def receive_weights(self) -> None:
        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        bucket, bucket_bytes = [], 0
        for name, shape, dtype in self._weight_layout.tensors:
            tensor = torch.empty(shape, dtype=dtypes[dtype], device=self.device)
            self._weight_group.broadcast(tensor)
            bucket.append((name, tensor))
            bucket_bytes += tensor.numel() * tensor.element_size()
            if bucket_bytes >= LOAD_BUCKET_BYTES:
                self.model_runner.model.load_weights(weights=bucket)
                bucket, bucket_bytes = [], 0
        if bucket:
            self.model_runner.model.load_weights(weights=bucket)
