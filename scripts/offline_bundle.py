"""Wheels for an offline machine: one directory with everything this project needs at run time that
the target lacks, small enough to carry (60 MiB by default), and the one line that installs it there.

    python scripts/offline_bundle.py --python-version 3.12 --have FREEZE.txt --out DIR
    python scripts/offline_bundle.py --python-version 3.12 --have FREEZE.txt --out DIR \\
        [--platform manylinux_2_28_x86_64] [--max-mib 60] [--with deepspeed] [--site /tmp/arpo-site]

``--have`` is what the target already has: a ``pip freeze`` file (``name==version`` lines) or a
list of names, one per line (comments, blank lines and pip options such as ``-e`` are ignored). A
pinned version there constrains the resolution, so that what the bundle brings works with it.

The requirements are pyproject.toml's ``dependencies`` plus the extras of ``--with`` (``deepspeed``
by default; ``--with`` alone for none), with Ray's ``default`` extra left out (``DROPPED_EXTRAS``):
vLLM is not among them (rollouts use the HF engine) and neither is the project itself, which the
target runs from its checkout on ``PYTHONPATH``. pip resolves them for the target's Python and
platform from wheel metadata alone (``pip install --dry-run --report``); a requirement that has
only an sdist is built into a wheel here (``pip wheel --no-build-isolation``, with ``DS_BUILD_OPS=0``
for DeepSpeed) and must come out pure Python. Every resolved package the target lacks is then
downloaded (``pip download --no-deps``), one version of each, and Ray's wheel is made to fit
(``slim_ray``): its Java jars dropped, its native binaries stripped of symbols, its RECORD
rewritten, its files recompressed at deflate's highest level.

The directory gets the wheels and a README.txt: the install line, each wheel and its size, the
total, the wheels built from sdists, what the bundle's Ray lacks and what was left out because the
target has it. The script prints the install line at the end, and exits with status 1, naming the
largest wheels, where the bundle exceeds ``--max-mib``. Needs the network (the package index) and
binutils' ``strip``; the wheels already in DIR are removed first.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20

# Ray's `default` extra is the dashboard and its metrics agent (aiohttp_cors, opencensus,
# opentelemetry, py-spy, colorful, smart_open, virtualenv, ...): rllib_arpo imports none of it, and
# Ray starts without them (no dashboard, no metrics agent).
DROPPED_EXTRAS = {"ray": {"default"}}
# paths inside Ray's wheel that a Python-only run never reads: the Java workers' jars
RAY_DROPPED_PATHS = ("ray/jars/",)
RAY_LACKS = (
    "ray/jars: the Java workers' jars (no Java or cross-language actors and tasks)",
    "the symbols of its ELF files (_raylet.so, gcs_server, raylet, the vendored extension modules; "
    "strip --strip-unneeded): native stack traces in a crash report show addresses, not function names",
    "the `default` extra's packages: ray.init starts no dashboard and no metrics agent, so the run's "
    "Ray metrics (rllib_arpo.runtime.metrics_export, the arpo_* gauges) reach no Prometheus; Tune's "
    "TensorBoard, CSV and JSON results are as always",
)
# where an sdist's build reads its options: DeepSpeed builds no CUDA ops ahead of time (JIT at run time)
SDIST_BUILD_ENV = {"DS_BUILD_OPS": "0"}
# legacy names of manylinux_2_<minor> platforms
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def read_have(path: Path) -> dict[str, str | None]:
    """What the target has, from a freeze file or a list of names: canonical name -> the pinned
    version (``name==version``) without its local label (``+cu130``: the index has the public
    release, and ``==`` matches it), or None for a name alone."""
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        have[canonicalize_name(requirement.name)] = Version(pins[0]).public if pins else None
    return have


def project_requirements(extras: list[str]) -> list[str]:
    """pyproject.toml's dependencies (less ``DROPPED_EXTRAS``) and the requirements of ``extras``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    unknown = set(extras) - set(project["optional-dependencies"])
    if unknown:
        raise SystemExit(f"--with: no such extra {sorted(unknown)} in pyproject.toml")
    requirements = []
    for line in project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]:
        requirement = Requirement(line)
        requirement.extras -= DROPPED_EXTRAS.get(canonicalize_name(requirement.name), set())
        requirements.append(str(requirement))
    return requirements


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_<minor>_<arch>`` and every older manylinux tag of the same architecture, as
    pip needs them listed (it takes ``--platform`` literally)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if match is None:
        raise SystemExit(f"--platform: expected manylinux_2_<glibc minor>_<arch>, got {platform!r}")
    newest, arch = int(match[1]), match[2]
    tags = []
    for minor in range(newest, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in LEGACY_MANYLINUX:
            tags.append(f"{LEGACY_MANYLINUX[minor]}_{arch}")
    return tags


def target_options(python_version: str, platform: str, built: Path) -> list[str]:
    """pip's options that select wheels for the target (and the wheels built here)."""
    abi = "cp" + python_version.replace(".", "")
    platforms = [option for tag in platform_tags(platform) for option in ("--platform", tag)]
    return [
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi,
        *platforms, "--find-links", str(built),
    ]  # fmt: skip


def pip(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m pip ARGUMENTS`` (this interpreter's pip), its output captured."""
    command = [sys.executable, "-m", "pip", *arguments]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})


def build_wheel(requirement: str, built: Path) -> None:
    """A wheel of ``requirement`` built here from its sdist, into ``built``; it must be pure Python,
    since it was built for this machine's Python, not the target's."""
    print(f"building a wheel of {requirement} from its sdist (the index has no wheel of it)")
    before = set(built.glob("*.whl"))
    completed = pip(
        "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(built), requirement, env=SDIST_BUILD_ENV
    )
    if completed.returncode != 0:
        raise SystemExit(f"building {requirement} failed:\n{completed.stderr[-3000:]}")
    [wheel] = set(built.glob("*.whl")) - before
    tags = parse_wheel_filename(wheel.name)[3]
    if not all(tag.abi == "none" and tag.platform == "any" for tag in tags):
        raise SystemExit(f"{wheel.name} is not pure Python: build it on a machine like the target")


def resolve(
    requirements: list[str], have: dict[str, str | None], options: list[str], work: Path, built: Path
) -> list[dict]:
    """The packages of a fresh install of ``requirements`` on the target, with the target's pinned
    versions as constraints: the metadata of each, from pip's install report (files in ``work``). A
    requirement that only an sdist can satisfy is built into a wheel in ``built`` (``build_wheel``),
    where the repeated resolution finds it (``options`` look there)."""
    (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
    pins = [f"{name}=={version}" for name, version in have.items() if version is not None]
    (work / "constraints.txt").write_text("\n".join(pins) + "\n")
    tried: list[str] = []
    while True:
        print(f"resolving {len(requirements)} requirements for the target ({len(pins)} of its versions pinned)")
        completed = pip(
            "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(work / "report.json"),
            "-r", str(work / "requirements.txt"), "-c", str(work / "constraints.txt"), *options,
        )  # fmt: skip
        if completed.returncode == 0:
            return [package["metadata"] for package in json.loads((work / "report.json").read_text())["install"]]
        missing = re.search(r"No matching distribution found for (\S+)", completed.stderr)
        if missing is None or missing[1] in tried:
            raise SystemExit(f"pip could not resolve the requirements:\n{completed.stderr[-3000:]}")
        build_wheel(missing[1], built)
        tried.append(missing[1])


def download(pins: list[str], options: list[str], out: Path) -> None:
    """The target's wheels of ``pins`` (``name==version``) downloaded into ``out`` by one pip run,
    whose lines (a few per package) show the progress."""
    print(f"downloading {len(pins)} wheels")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off", "-d", str(out)]
    if subprocess.run([*command, *pins, *options]).returncode != 0:
        raise SystemExit("pip could not download the wheels (its error is above)")


def is_elf(data: bytes) -> bool:
    """Whether ``data`` is an ELF file (a shared library or an executable)."""
    return data[:4] == b"\x7fELF"


def stripped(data: bytes, scratch: Path) -> bytes:
    """``data``, an ELF file, after ``strip --strip-unneeded`` (symbols the loader does not need)."""
    path = scratch / "elf"
    path.write_bytes(data)
    subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
    return path.read_bytes()


def record_line(name: str, data: bytes) -> str:
    """The RECORD line of one file of a wheel: path, urlsafe base64 sha256 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim_ray(wheel: Path) -> None:
    """Ray's wheel, rewritten in place to fit: without ``RAY_DROPPED_PATHS``, its ELF files stripped
    (their permissions kept: the binaries stay executable), its RECORD rewritten to match, every file
    compressed at deflate's highest level."""
    print(f"slimming {wheel.name}: no {', '.join(RAY_DROPPED_PATHS)}, native binaries stripped")
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as source, tempfile.TemporaryDirectory() as scratch:
        entries = [info for info in source.infolist() if not info.filename.startswith(RAY_DROPPED_PATHS)]
        [record] = [info for info in entries if re.fullmatch(r"[^/]+\.dist-info/RECORD", info.filename)]
        records = []
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
            for info in entries:
                if info is record:
                    continue
                data = source.read(info)
                if is_elf(data):
                    data = stripped(data, Path(scratch))
                target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                records.append(record_line(info.filename, data))
            records.append(f"{record.filename},,")
            target.writestr(record, "\n".join(records) + "\n", compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    slim.replace(wheel)


def install_line(out: str, site: str) -> str:
    """The target's offline install: the bundle's wheels into ``site``, the checkout on PYTHONPATH."""
    return (
        f"python3 -m pip install --no-index --no-deps --no-compile --target {site} {out}/*.whl "
        f"&& export PYTHONPATH={site}:$PWD"
    )


def write_readme(out: Path, args: argparse.Namespace, built: list[str], left_out: list[str], line: str) -> None:
    """README.txt in the bundle: the install line, the wheels and their sizes, the sdists built
    here, what the bundle's Ray lacks, what was left out because the target has it."""
    wheels = sorted(out.glob("*.whl"), key=lambda wheel: -wheel.stat().st_size)
    total = sum(wheel.stat().st_size for wheel in wheels)
    lines = [
        "rllib-arpo: an offline bundle (scripts/offline_bundle.py)",
        f"target: CPython {args.python_version}, {args.platform} (and older manylinux)",
        f"extras: {', '.join(args.extras) or 'none'}; Ray without its `default` extra; no vLLM; the project "
        "itself runs from its checkout",
        "",
        "install, from the checkout's root (the bundle beside it):",
        f"    {line}",
        "",
        f"wheels: {len(wheels)}, {total / MIB:.1f} MiB",
        *(f"    {wheel.stat().st_size / MIB:6.2f} MiB  {wheel.name}" for wheel in wheels),
        "",
        f"built here from an sdist (the index has no wheel): {', '.join(built) or 'none'}",
        "",
        "what this bundle's Ray lacks:",
        *(f"    - {lack}" for lack in RAY_LACKS),
        "",
        f"left out because the target has them ({len(left_out)}): {', '.join(left_out)}",
    ]
    (out / "README.txt").write_text("\n".join(lines) + "\n")


def check_size(out: Path, max_mib: float) -> None:
    """Exits with status 1, naming the largest wheels, where the bundle exceeds ``max_mib``."""
    wheels = sorted(out.glob("*.whl"), key=lambda wheel: -wheel.stat().st_size)
    total = sum(wheel.stat().st_size for wheel in wheels) / MIB
    if total > max_mib:
        largest = ", ".join(f"{wheel.name} ({wheel.stat().st_size / MIB:.1f} MiB)" for wheel in wheels[:5])
        print(f"the bundle is {total:.1f} MiB, over --max-mib {max_mib:g}; largest: {largest}", file=sys.stderr)
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", required=True, help="the target's Python, e.g. 3.12")
    parser.add_argument("--have", type=Path, required=True, help="pip freeze file or list of names the target has")
    parser.add_argument("--out", required=True, help="the bundle's directory")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="the target's newest manylinux tag")
    parser.add_argument("--max-mib", type=float, default=60.0, help="the bundle's size limit")
    parser.add_argument("--with", dest="extras", nargs="*", default=["deepspeed"], help="extras of pyproject.toml")
    parser.add_argument("--site", default="/tmp/arpo-site", help="where the install line installs on the target")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # the progress lines in order with pip's, also into a pipe

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    have = read_have(args.have)
    with tempfile.TemporaryDirectory() as work:
        built_dir = Path(work) / "built"
        built_dir.mkdir()
        options = target_options(args.python_version, args.platform, built_dir)
        resolved = resolve(project_requirements(args.extras), have, options, Path(work), built_dir)
        needed = [metadata for metadata in resolved if canonicalize_name(metadata["name"]) not in have]
        left_out = sorted(metadata["name"] for metadata in resolved if canonicalize_name(metadata["name"]) in have)
        built = [wheel.name for wheel in built_dir.glob("*.whl")]
        download([f"{metadata['name']}=={metadata['version']}" for metadata in needed], options, out)
    for wheel in out.glob("ray-*.whl"):
        slim_ray(wheel)
    line = install_line(args.out, args.site)
    write_readme(out, args, built, left_out, line)
    print((out / "README.txt").read_text())
    check_size(out, args.max_mib)
    print(line)


if __name__ == "__main__":
    main()
