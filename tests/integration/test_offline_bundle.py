"""scripts/offline_bundle.py (docs/scaling.md) at its smallest: a bundle for this machine's Python,
installed with its own offline line into a fresh venv that already has the rest (as the GPU
machine has torch and transformers), runs the laptop demo for one iteration. Building the bundle
needs the package index, as the project's install does."""

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
# what the test's bundle must bring: Ray (repacked, the risky part), packages with native code, a
# package with only an sdist (deepspeed), pure-Python ones; the venv has everything else
BUNDLED = {
    "ray", "lz4", "ormsgpack", "dm-tree", "deepspeed", "hjson", "gymnasium", "farama-notifications", "tensorboardx",
    "bm25s",
}  # fmt: skip
# Ray's `default` extra, which the bundle leaves out and the GPU machine lacks: the venv lacks it too
DASHBOARD_PACKAGES = ("aiohttp-cors", "colorful", "opencensus", "opentelemetry", "py-spy", "smart-open", "virtualenv")


def hidden(name: str) -> bool:
    """Whether the fresh venv must not see this venv's distribution ``name``: the bundle's, the
    dashboard's, and the project itself (it runs from the checkout)."""
    return name in BUNDLED or name.startswith(DASHBOARD_PACKAGES) or name == "rllib-arpo"


def link_site_packages(farm: Path) -> list[str]:
    """Symlinks in ``farm`` to this venv's site-packages less the ``hidden`` distributions; the
    ``name==version`` lines of the distributions that stay (the target's freeze)."""
    site = Path(sysconfig.get_path("purelib"))
    kept, dropped, have = set(), set(), []
    for distribution in importlib.metadata.distributions(path=[str(site)]):
        name = canonicalize_name(distribution.metadata["Name"])
        # a module's bytecode in site-packages/__pycache__ is never imported without its source
        tops = {file.parts[0] for file in distribution.files or [] if file.parts[0] not in ("..", "__pycache__")}
        (dropped if hidden(name) else kept).update(tops)
        if not hidden(name):
            have.append(f"{name}=={distribution.version}")
    assert not kept & dropped, f"hidden and kept distributions share {kept & dropped}"
    farm.mkdir()
    for entry in site.iterdir():
        if entry.name not in dropped:
            (farm / entry.name).symlink_to(entry)
    return have


def test_offline_bundle_installs_without_an_index_and_runs_the_demo(tiny_policy_cache, tmp_path):
    have = link_site_packages(tmp_path / "have")
    (tmp_path / "have.txt").write_text("\n".join(have) + "\n")
    bundle, site = tmp_path / "bundle", tmp_path / "site"
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    glibc = platform.libc_ver()[1].replace(".", "_")
    command = [
        sys.executable, str(REPO / "scripts" / "offline_bundle.py"), "--python-version", python_version,
        "--have", str(tmp_path / "have.txt"), "--out", str(bundle), "--platform", f"manylinux_{glibc}_x86_64",
        "--site", str(site),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    install_line = completed.stdout.splitlines()[-1]
    assert install_line.startswith("python3 -m pip install --no-index --no-deps")

    wheels = {canonicalize_name(parse_wheel_filename(wheel.name)[0]): wheel for wheel in bundle.glob("*.whl")}
    assert set(wheels) >= BUNDLED and not set(wheels) & {line.split("==")[0] for line in have}
    with zipfile.ZipFile(wheels["ray"]) as ray_wheel:
        assert not [name for name in ray_wheel.namelist() if name.startswith("ray/jars/")]
    readme = (bundle / "README.txt").read_text()
    assert install_line in readme and all(wheel.name in readme for wheel in wheels.values())
    assert "deepspeed-0.19.8-py3-none-any.whl" in readme.split("built here from an sdist")[1].splitlines()[0]

    # the fresh venv: no pip of its own, no index; this venv's packages less the hidden ones
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    [fresh_site] = fresh.glob("lib/python*/site-packages")
    (fresh_site / "have.pth").write_text(f"{tmp_path / 'have'}\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{fresh / 'bin'}:{env['PATH']}"
    demo = (
        "python3 -c 'import ray; print(ray.__file__)' && python3 -m rllib_arpo.cli train file "
        "tuned_examples/arpo_tiny.yaml --stop '{\"training_iteration\": 1}' --config '{\"held_out_interval\": 0}' "
        f"--storage-path {tmp_path / 'results'}"
    )
    command = ["bash", "-c", f"{install_line} && {demo}"]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    assert f"{site}/ray/__init__.py" in completed.stdout  # Ray came from the bundle
    assert not (site / "ray" / "jars").exists() and os.access(site / "ray" / "core/src/ray/raylet/raylet", os.X_OK)
    [result] = (tmp_path / "results").glob("arpo-tiny/*/result.json")
    assert [json.loads(line)["training_iteration"] for line in result.read_text().splitlines()] == [1]
