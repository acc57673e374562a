"""How ``VLLMEngine`` starts vLLM: the CPU backend's arguments (``on_the_cpu``) and where vLLM's engine
core and worker run, with the environment ``LLM()`` reads (``start_environment``: option
``engine_process`` of the vllm engine, documented there)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from transformers import AutoConfig
from vllm import envs
from vllm.platforms import current_platform

CPU_BATCHED_TOKENS = 4096
"""vLLM's default token budget of one engine step on CPU (``max_num_batched_tokens``)."""

ENGINE_CORES_RUN_HERE: list[str] = []
"""The models of the engines whose engine core ran in this process (``engine_process`` false). vLLM
0.32 cannot start a second one here (its CPU kernel overrides register once per process and fail the
second time), so every later engine of this process gets processes of its own."""


def on_the_cpu(model_path: str, max_model_len: int | None, llm_kwargs: dict) -> dict:
    """``llm_kwargs`` with vLLM 0.32's CPU defaults. Eager: its CPU build compiles the graph with Inductor
    off and never loads its compile cache back ("'function' object has no attribute 'finalize_loading'"),
    so each start compiled again for no speed (SmolLM2-135M, 2 cores: started in 190 s compiled, 37 s
    eager; 69 and 73 tokens/s). Whole prefills: a seeded request whose prefill is split over two steps
    has its generator rewound, which a CPU generator cannot do ("CPU Generator does not use offset")."""
    arguments = {"enforce_eager": True, **llm_kwargs}
    if "enable_chunked_prefill" not in llm_kwargs:
        longest = max_model_len or AutoConfig.from_pretrained(model_path).max_position_embeddings
        budget = max(llm_kwargs.get("max_num_batched_tokens") or CPU_BATCHED_TOKENS, longest)
        arguments.update(enable_chunked_prefill=False, max_num_batched_tokens=budget)
    return arguments


def in_a_ray_actor() -> bool:
    """Whether this process is a Ray actor's (not a driver's, nor one without Ray)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


@contextmanager
def start_environment(engine_process: bool | None, cpu_reserved_cores: int | None, model_path: str) -> Iterator[None]:
    """Inside the block, the environment ``LLM()`` and the engine process it may start read:
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` as ``engine_process`` says (null: in this process where it is a
    Ray actor's on the CPU backend and no engine core ran here yet), ``VLLM_CPU_NUM_OF_RESERVED_CPU``
    where ``cpu_reserved_cores`` is set; the old values after it, also when the start fails."""
    if engine_process is None:
        engine_process = not (current_platform.is_cpu() and in_a_ray_actor()) or bool(ENGINE_CORES_RUN_HERE)
    elif not engine_process and ENGINE_CORES_RUN_HERE:
        raise ValueError(
            "engine_process: false: an engine core already ran in this process, and vLLM cannot start a "
            "second one in it (its CPU kernels register once per process); use engine_process: true"
        )
    values = {"VLLM_ENABLE_V1_MULTIPROCESSING": str(int(engine_process))}
    if cpu_reserved_cores is not None:
        values["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cpu_reserved_cores)
    # an engine core in this process cached the environment of its start (vllm.envs): not for this one
    envs.disable_envs_cache()
    if not engine_process:  # counted before the start: one that fails half-way cannot start again here
        ENGINE_CORES_RUN_HERE.append(model_path)
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
