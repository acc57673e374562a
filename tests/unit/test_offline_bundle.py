"""scripts/offline_bundle.py's parts that need no network: the have-list, the platform tags, the
requirements, and Ray's wheel made to fit (tests/integration/test_offline_bundle.py builds and
installs a whole bundle)."""

import base64
import hashlib
import shutil
import zipfile

import pytest


@pytest.fixture(scope="module")
def bundle(load_script):
    return load_script("offline_bundle")


def test_have_reads_freeze_pins_and_plain_names(bundle, tmp_path):
    have = tmp_path / "have.txt"
    lines = ["# the target", "-e /work/main", "Torch==2.11.0+cu130", "", "huggingface_hub==1.33.0  # hub", "PyYAML"]
    have.write_text("\n".join(lines) + "\n")
    assert bundle.read_have(have) == {"torch": "2.11.0", "huggingface-hub": "1.33.0", "pyyaml": None}


def test_platform_tags_list_every_older_manylinux(bundle):
    tags = bundle.platform_tags("manylinux_2_28_x86_64")
    assert tags[:2] == ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64"] and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64"} <= set(tags)
    with pytest.raises(SystemExit, match="--platform"):
        bundle.platform_tags("linux_x86_64")


def test_requirements_are_ray_without_its_dashboard_and_the_extras(bundle):
    requirements = bundle.project_requirements(["deepspeed"])
    assert "ray[rllib]==2.60.0" in requirements and "deepspeed==0.19.8" in requirements
    assert not any(requirement.startswith("vllm") for requirement in requirements)
    with pytest.raises(SystemExit, match="no such extra"):
        bundle.project_requirements(["dashboard"])


def test_slim_ray_drops_the_jars_strips_binaries_and_rewrites_record(bundle, tmp_path):
    binary = shutil.which("true")
    with open(binary, "rb") as file:
        elf = file.read()
    wheel = tmp_path / "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"
    executable = zipfile.ZipInfo("ray/core/src/ray/raylet/raylet")
    executable.external_attr = 0o100755 << 16
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(executable, elf)
        archive.writestr("ray/__init__.py", "VERSION = 1\n")
        archive.writestr("ray/jars/ray_dist.jar", b"jar")
        archive.writestr("ray/thirdparty/x-1.0.dist-info/RECORD", "x/__init__.py,,\n")
        archive.writestr("ray-2.60.0.dist-info/RECORD", "stale\n")
    bundle.slim_ray(wheel)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "ray/jars/ray_dist.jar" not in names and len(names) == 4
        assert (archive.getinfo("ray/core/src/ray/raylet/raylet").external_attr >> 16) & 0o111
        assert len(archive.read("ray/core/src/ray/raylet/raylet")) <= len(elf)
        record = archive.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
        assert len(record) == len(names) and "ray-2.60.0.dist-info/RECORD,," in record
        for line in record[:-1]:
            path, digest, size = line.split(",")
            data = archive.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_a_bundle_over_the_limit_fails_naming_its_largest_wheels(bundle, tmp_path, capsys):
    (tmp_path / "ray-2.60.0-py3-none-any.whl").write_bytes(bytes(3 * bundle.MIB))
    (tmp_path / "lz4-4.4.5-py3-none-any.whl").write_bytes(bytes(bundle.MIB))
    bundle.check_size(tmp_path, max_mib=4)
    with pytest.raises(SystemExit) as exit_info:
        bundle.check_size(tmp_path, max_mib=3.5)
    assert exit_info.value.code == 1
    assert "4.0 MiB, over --max-mib 3.5; largest: ray-2.60.0-py3-none-any.whl (3.0 MiB), lz4" in capsys.readouterr().err
