import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(autouse=True)
def _one_thread():
    """Unit tests use one torch thread: small tensors, and results independent of the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def user_registrations_undone(monkeypatch):
    """What importing a user's module changes is undone after the test: ``sys.path`` and the tool
    and dataset-type registries its decorators add to (a tool a test registered is unknown to the
    tests after it in the worker)."""
    from rllib_arpo.data.registry import DATASET_LOADERS
    from rllib_arpo.tools.base import TOOLS

    monkeypatch.setattr(sys, "path", list(sys.path))
    for registry in (TOOLS, DATASET_LOADERS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))


@pytest.fixture
def non_utf8_parquet():
    """Writes a verl parquet file whose one message holds Latin-1 bytes, in a ``binary`` column or
    (mislabelled) in a ``string`` one: ``non_utf8_parquet(path, "binary" | "string") -> str``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path, content_type: str) -> str:
        content = pa.array([b"caf\xe9 ?"], type=pa.binary())
        if content_type == "string":
            content = content.view(pa.string())
        message = pa.StructArray.from_arrays([pa.array(["user"]), content], names=["role", "content"])
        prompt = pa.ListArray.from_arrays(pa.array([0, 1], type=pa.int32()), message)
        pq.write_table(pa.table({"prompt": prompt, "reward_model": pa.array([{"ground_truth": "a"}])}), path)
        return str(path)

    return write


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A tiny policy as a ``save_pretrained`` directory (model and tokenizer), built once per
    session: a 1-layer Qwen2 of hidden size 64 over a 300-token vocabulary, untrained. Tests read
    it and never write into it."""
    from rllib_arpo.models.tiny_policy import build_tiny_policy, build_tokenizer

    tokenizer = build_tokenizer(["Where is the tower? <search>tower</search> <answer>Paris</answer>"], vocab_size=300)
    model = build_tiny_policy(
        tokenizer,
        hidden_size=64,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    directory = tmp_path_factory.mktemp("tiny_policy")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="session")
def load_script():
    """``load_script(name)``: ``scripts/<name>.py`` imported as a module (its ``main`` not run), so
    a test calls the script's functions directly."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve the module's annotations through it
        spec.loader.exec_module(module)
        return module

    return load


class CharacterTokenizer:
    """A tokenizer without a chat template whose ids are the characters' code points, so a prompt's
    ids spell its text exactly (``data.prompts.encode_prompt``'s plain branch)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


class ChatMLCharacterTokenizer(CharacterTokenizer):
    """``CharacterTokenizer`` with a ChatML chat template: chat messages go through
    ``apply_chat_template`` (rendered here as ChatML, the generation prompt at the end), never
    through ``encode``."""

    chat_template = "chatml"

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        raise AssertionError(f"a tokenizer with a chat template encoded plain text: {text!r}")

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> list[int]:
        assert add_generation_prompt and tokenize
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return [ord(c) for c in text + "<|im_start|>assistant\n"]


@pytest.fixture
def plain_tokenizer() -> CharacterTokenizer:
    """A tokenizer without a chat template, ids = code points (``CharacterTokenizer``)."""
    return CharacterTokenizer()


@pytest.fixture
def chat_tokenizer() -> ChatMLCharacterTokenizer:
    """A tokenizer with a ChatML chat template, ids = code points (``ChatMLCharacterTokenizer``)."""
    return ChatMLCharacterTokenizer()
