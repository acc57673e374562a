"""An optional extra that is installed but cannot be imported fails its tests instead of skipping
them: a broken install must turn CI red, not shrink it silently. A stand-in package whose import
raises the error of a missing dependency is put first on the path of a pytest subprocess. An
optional task library that is absent leaves the package importable, and its dataset type says how
to install it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def pytest_with_broken(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    package = tmp_path / module
    package.mkdir()
    (package / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'xformers'\", name='xformers')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=300)


def test_a_broken_vllm_fails_the_vllm_tier(tmp_path):
    result = pytest_with_broken("vllm", tmp_path, "--collect-only", str(TESTS / "vllm"))
    assert result.returncode != 0, result.stdout
    assert "ModuleNotFoundError: No module named 'xformers'" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "module, test", [("deepspeed", "test_deepspeed_config.py::test_on_cpu_the_shared_memory_op_is_never_built")]
)
def test_a_broken_extra_fails_its_test(tmp_path, module, test):
    result = pytest_with_broken(module, tmp_path, str(TESTS / "unit" / test))
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    "module, spec, message",
    [
        (
            "reasoning_gym",
            {"type": "reasoning_gym", "task": "basic_arithmetic"},
            "the reasoning_gym dataset type needs the reasoning-gym package: pip install rllib-arpo[reasoning-gym]",
        ),
        (
            "verifiers",
            {"type": "verifiers", "env": "arpo_sums_env"},
            "the verifiers dataset type needs the verifiers package: "
            "pip install rllib-arpo[verifiers] && pip install --no-deps verifiers==0.4.0",
        ),
    ],
)
def test_without_a_task_library_the_package_imports_and_the_spec_says_what_to_install(module, spec, message):
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"  # None in sys.modules: every import of it fails
        "import rllib_arpo, rllib_arpo.data\n"
        "from rllib_arpo.data.registry import load_dataset\n"
        f"try:\n    load_dataset({spec!r})\n"
        "except ValueError as error:\n    print(error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == message + "\n"
