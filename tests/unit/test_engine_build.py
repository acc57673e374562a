"""``Engine.build``: how every caller builds a registered generation engine."""

import torch

from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.rollout.engine import Engine


class Recorder:
    """An engine class that returns what ``from_pretrained`` was given."""

    @classmethod
    def from_pretrained(cls, path, *, dtype=None, **options):
        return path, dtype, options


ENTRY = Engine(f"{__name__}:Recorder", in_place_options={"worker_extension_cls": "receiver", "seed": 1})


def test_build_passes_the_path_dtype_and_options():
    assert ENTRY.build("model", torch.float32, {"seed": 3}) == ("model", torch.float32, {"seed": 3})


def test_in_place_options_are_added_unless_set():
    built = ENTRY.build("model", None, {"seed": 3}, receives_in_place=True)
    assert built == ("model", None, {"worker_extension_cls": "receiver", "seed": 3})


def test_lora_settings_are_passed_only_where_set():
    lora = LoraSettings(rank=4)
    assert ENTRY.build("model", None, {}, lora=lora) == ("model", None, {"lora": lora})
    assert ENTRY.build("model", None, {}, lora=None) == ("model", None, {})
