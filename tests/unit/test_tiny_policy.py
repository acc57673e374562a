import unicodedata

import pytest
import torch
from transformers import AutoTokenizer, Qwen2Config

from rllib_arpo.cold_start.saved_tiny_policy import load_or_build_tiny_policy, save_tiny_policy
from rllib_arpo.data.tir_task import SPLIT_NAMES, TIRTask, format_prompt
from rllib_arpo.models.tiny_policy import TAG_TOKENS, build_tiny_policy, build_tokenizer

TRICKY_TEXTS = [
    "<think> I need the population of Zorvath. </think> <search> population of Zorvath </search>",
    "<result>\n  -7\n</result><answer> \\boxed{337491} </answer>",
    'Traceback (most recent call last):\n  File "main.py", line 1, in <module>\nZeroDivisionError: division by zero',
    "tabs\tand  double  spaces,\r\nCRLF, trailing space ",
    "naïve café 中文 🙂 \x08oxed{x} \u200b \x00\x7f",
    " . , ' s n't (leading space and punctuation a cleanup would eat)",
    "<think><think></think>",
]


@pytest.fixture(scope="module")
def task_text() -> list[str]:
    task = TIRTask(seed=0, num_entities=16, num_train=9, num_valid=3, num_test=3)
    return task.corpus() + [format_prompt(example) for name in SPLIT_NAMES for example in task.split(name)]


@pytest.fixture(scope="module")
def tokenizer(task_text):
    return build_tokenizer(task_text, vocab_size=400)


def check_tokenizer(tokenizer) -> None:
    for text in TRICKY_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    vocab = len(tokenizer)
    tag_ids = [tokenizer.convert_tokens_to_ids(tag) for tag in TAG_TOKENS]
    assert sorted(tag_ids) == list(range(vocab - 12, vocab))  # 12 tags, added after the BPE vocabulary
    for tag, tag_id in zip(TAG_TOKENS, tag_ids):
        assert tokenizer.encode(f"x{tag}y")[1] == tag_id  # one token, also glued to other text
        assert tokenizer.encode(tag) == [tag_id]
        assert tag_id not in tokenizer.all_special_ids
    assert tokenizer.decode(tokenizer.encode("<think> a </think>"), skip_special_tokens=True) == "<think> a </think>"
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.all_special_tokens == ["<|endoftext|>"]


def test_tokenizer_round_trip_tags_and_eos(tokenizer):
    assert set(TAG_TOKENS) == {
        f"<{slash}{name}>"
        for name in ("think", "search", "python", "browse", "result", "answer")
        for slash in ("", "/")
    }
    check_tokenizer(tokenizer)
    assert len(tokenizer) == 400 + 12  # the BPE fills vocab_size (256 bytes + <|endoftext|> + 143 merges)
    assert len(tokenizer.encode(" 48213")) == 1 + 5  # the space, then one token per digit
    decomposed = "Cafe\u0301"  # "e" + combining acute accent: not in NFC
    assert tokenizer.decode(tokenizer.encode(decomposed)) == unicodedata.normalize("NFC", decomposed) == "Caf\u00e9"


def test_auto_tokenizer_reloads_the_same_tokenizer(tokenizer, task_text, tmp_path):
    """What vLLM and ``AutoTokenizer`` load beside a Qwen2 config encodes exactly like the
    tokenizer that was built."""
    tokenizer.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TRICKY_TEXTS + task_text:
        assert reloaded.encode(text) == tokenizer.encode(text)
    check_tokenizer(reloaded)


def test_model_shapes_and_forward(tokenizer):
    model = build_tiny_policy(tokenizer)
    config = model.config
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == config.pad_token_id == tokenizer.eos_token_id
    attention = model.model.layers[0].self_attn
    assert attention.head_dim == 64 == config.hidden_size // config.num_attention_heads
    assert attention.q_proj.weight.shape == (2 * 64, 128)  # num_heads * head_dim
    assert attention.k_proj.weight.shape == (2 * 64, 128)  # num_kv_heads * head_dim
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    # per layer: q, k and v 128*128+128 each, o 128*128, MLP 3*128*256, 2 norms of 128
    per_layer = 3 * (128 * 128 + 128) + 128 * 128 + 3 * 128 * 256 + 2 * 128
    assert sum(p.numel() for p in model.parameters()) == len(tokenizer) * 128 + 2 * per_layer + 128

    ids = torch.tensor([tokenizer.encode("Question: What is 3817 * 29 + 112?\nAnswer: <think>")] * 2)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_initialisation_is_seeded_and_leaves_global_rng_alone(tokenizer):
    rng_state = torch.get_rng_state()
    first = build_tiny_policy(tokenizer, seed=0).state_dict()
    again = build_tiny_policy(tokenizer, seed=0).state_dict()
    other = build_tiny_policy(tokenizer, seed=1).state_dict()
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_rejects_unsupported_head_sizes(tokenizer):
    with pytest.raises(ValueError, match="hidden_size must be 64 \\* num_heads = 128, got 96"):
        build_tiny_policy(tokenizer, hidden_size=96)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        build_tiny_policy(tokenizer, hidden_size=192, num_heads=3, num_kv_heads=2)


def test_save_and_load_round_trip(tmp_path):
    directory = tmp_path / "tiny"
    sizes = dict(hidden_size=64, num_heads=1, num_kv_heads=1, intermediate_size=64)
    model, tokenizer = load_or_build_tiny_policy(directory, vocab_size=512, sft_steps=0, **sizes)  # builds and saves
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny"]  # the staging directory is gone
    assert (directory / "model.safetensors").exists() and (directory / "tokenizer.json").exists()
    check_tokenizer(tokenizer)
    assert len(tokenizer) == 512 + 12
    fresh = build_tiny_policy(tokenizer, seed=0, **sizes)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))

    # a second call reuses the saved policy: its own build arguments (another seed) are ignored
    reloaded, reloaded_tokenizer = load_or_build_tiny_policy(directory, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))
    assert reloaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert save_tiny_policy(tmp_path / "again", vocab_size=512, sft_steps=0, **sizes) == tmp_path / "again"
    assert (tmp_path / "again" / "tokenizer.json").read_text() == (directory / "tokenizer.json").read_text()

    unrelated = tmp_path / "not_a_policy"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("keep me")
    with pytest.raises(OSError):  # never overwrites a directory that holds something else
        load_or_build_tiny_policy(unrelated, vocab_size=512, sft_steps=0, **sizes)
    assert [path.name for path in unrelated.iterdir()] == ["notes.txt"]
    assert not [path for path in tmp_path.iterdir() if "building" in path.name]
