"""Every experiment file of docs/scaling.md passes ``rllib train file X --dry-run``, with a
config.json of the Qwen2.5 model it names in place of the checkpoint (not available offline),
and asks Ray for the resources the sheet says. No Ray starts."""

import json
import re
from pathlib import Path

import pytest

from rllib_arpo.cli import main

REPO = Path(__file__).resolve().parents[2]
SHEET = REPO / "docs" / "scaling.md"
QWEN2_5 = {
    "Qwen2.5-1.5B-Instruct": {
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    },
    "Qwen2.5-7B-Instruct": {
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    },
}  # fmt: skip
RESOURCES = {
    "arpo_qwen_1gpu.yaml": "one trial asks Ray for 2 CPU, 1 GPU (placement group, strategy PACK)",
    "arpo_qwen_lora_1gpu.yaml": "one trial asks Ray for 2 CPU, 1 GPU (placement group, strategy PACK)",
    "arpo_qwen_8gpu.yaml": "one trial asks Ray for 5 CPU, 8 GPU (placement group, strategy PACK)",
    "arpo_qwen_nodes.yaml": (
        "one trial asks Ray for 17 CPU, 24 GPU, 8 learner_node, 16 rollout_node (placement group, strategy PACK)"
    ),
}


def test_the_sheet_links_exactly_these_experiment_files():
    assert sorted(set(re.findall(r"tuned_examples/(arpo_qwen_\w+\.yaml)", SHEET.read_text()))) == sorted(RESOURCES)


@pytest.mark.parametrize("example", sorted(RESOURCES))
def test_each_experiment_file_of_the_sheet_passes_the_dry_run(example, arpo_data, tmp_path, capsys):
    from transformers import Qwen2Config

    path = REPO / "tuned_examples" / example
    [model] = re.findall(r"model_path: /models/(\S+)", path.read_text())
    Qwen2Config(max_position_embeddings=32768, **QWEN2_5[model]).save_pretrained(tmp_path / model)
    override = json.dumps({"model_path": str(tmp_path / model)})
    assert main(["train", "file", str(path), "--dry-run", "--config", override]) == 0
    out = capsys.readouterr().out
    assert RESOURCES[example] in out
    assert "GiB per GPU" in out
