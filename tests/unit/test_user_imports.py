"""The user's own modules (``imports:``, ``--import``): imported before the config is checked, by
module name or ``.py`` path, one line for each bad entry, and the same imports in a fresh
process through the hook Ray's workers run."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ray
from ray import cloudpickle, tune

from rllib_arpo.cli import main
from rllib_arpo.commands.train import train_file
from rllib_arpo.core.user_imports import UserImports, UserModule, import_user_modules
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.experiment.file import load_experiments

MYEXT = """
from rllib_arpo.tools.base import TOOLS


@TOOLS.register("shout")
class Shout:
    def __call__(self, query: str) -> str:
        return query.upper()
"""


@pytest.fixture(autouse=True)
def restore_imports(monkeypatch, user_registrations_undone):
    """Each test's modules and ``sys.path`` entries are gone after it, and so is the tool they
    register; Ray and Tune must not start."""
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("Ray was started"))
    monkeypatch.setattr(tune, "Tuner", lambda *args, **kwargs: pytest.fail("Tune was started"))
    yield
    for name in ("myext", "my_pkg", "my_pkg.ext", "broken"):
        sys.modules.pop(name, None)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_py_path_is_imported_under_its_stem_with_its_directory_first(tmp_path):
    write(tmp_path / "ext" / "myext.py", "VALUE = 7\n")
    imports = import_user_modules(["ext/myext.py"], tmp_path)
    assert imports == UserImports((UserModule("ext/myext.py", "myext", str(tmp_path / "ext")),))
    assert sys.modules["myext"].VALUE == 7
    assert sys.path[0] == str(tmp_path / "ext")
    # an absolute path does not depend on the base
    assert import_user_modules([str(tmp_path / "ext" / "myext.py")], Path("/")).modules[0].name == "myext"


def test_a_module_name_is_imported_from_sys_path(tmp_path):
    write(tmp_path / "my_pkg" / "__init__.py", "")
    write(tmp_path / "my_pkg" / "ext.py", "VALUE = 8\n")
    sys.path.append(str(tmp_path))
    imports = import_user_modules(["my_pkg.ext"], Path("/elsewhere"))
    assert imports == UserImports((UserModule("my_pkg.ext", "my_pkg.ext"),))
    assert sys.modules["my_pkg.ext"].VALUE == 8


@pytest.mark.parametrize(
    "entries, message",
    [
        ("myext.py", "imports: expected a list of module names or .py paths, got 'myext.py'"),
        (["myext.py", 3], "imports: expected a list of module names or .py paths, got ['myext.py', 3]"),
        (["nosuch.py"], "imports: 'nosuch.py': no such file (looked at {tmp}/nosuch.py)"),
        (["broken.py"], "imports: 'broken.py' raised NameError: name 'x' is not defined"),
        (["no_such_module"], "imports: 'no_such_module' raised ModuleNotFoundError: No module named 'no_such_module'"),
        (["json.py"], "imports: 'json.py': its module name 'json' is taken by {json} (rename the file)"),
    ],
)
def test_each_bad_entry_is_one_line_naming_it(tmp_path, entries, message):
    import json

    write(tmp_path / "broken.py", "y = x + 1\n")
    write(tmp_path / "json.py", "")
    with pytest.raises(ValueError) as raised:
        import_user_modules(entries, tmp_path)
    assert str(raised.value) == message.format(tmp=tmp_path, json=json.__file__)


def experiment(tmp_path: Path, imports_line: str, config_line: str = "", tool: str = "shout") -> str:
    """An experiment file using the tool of ``myext.py`` beside it."""
    write(tmp_path / "myext.py", MYEXT)
    config = f"    model_path: tiny\n{config_line}    tools: {{{tool}: {{}}}}\n"
    return str(write(tmp_path / "experiment.yaml", f"x:\n{imports_line}  run: ARPO\n  config:\n{config}"))


@pytest.mark.parametrize(
    "imports_line, config_line",
    [("  imports: [myext.py]\n", ""), ("", "    imports: [myext.py]\n")],
    ids=["beside run", "in config"],
)
def test_the_file_imports_before_its_tools_are_checked(tmp_path, imports_line, config_line):
    [loaded] = load_experiments(experiment(tmp_path, imports_line, config_line)).values()
    assert loaded["imports"] == UserImports((UserModule("myext.py", "myext", str(tmp_path)),))
    assert "imports" not in loaded["config"] and loaded["config"]["tools"] == {"shout": {}}


def test_without_the_import_the_tool_is_unknown_and_a_misspelt_one_gets_its_hint(tmp_path):
    with pytest.raises(ConfigError, match="tools.shout: unknown tool 'shout'"):
        load_experiments(experiment(tmp_path, ""))
    misspelt = experiment(tmp_path, "  imports: [myext.py]\n", tool="shoot")
    with pytest.raises(ConfigError, match=r"^experiment 'x': tools.shoot: unknown tool 'shoot' \(did you mean 'shout'"):
        load_experiments(misspelt)


def test_a_bad_entry_of_the_file_names_the_experiment(tmp_path):
    path = experiment(tmp_path, "  imports: [nosuch.py]\n")
    with pytest.raises(ConfigError, match=r"^experiment 'x': imports: 'nosuch.py': no such file \(looked at "):
        load_experiments(path)


def test_the_command_line_imports_relative_to_the_working_directory(tmp_path, monkeypatch, capsys):
    path = experiment(tmp_path, "")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "file", path, "--import", "myext.py", "--dry-run"]) == 0
    assert 'tools: {"shout": {}}' in capsys.readouterr().out
    assert main(["train", "file", path, "--import", "nosuch.py"]) == 2
    assert capsys.readouterr().err == (
        f"rllib: error: {path}: --import: 'nosuch.py': no such file (looked at {tmp_path}/nosuch.py)\n"
    )


def test_imports_in_the_config_override_point_to_the_command_line_flag(tmp_path):
    path = experiment(tmp_path, "  imports: [myext.py]\n")
    with pytest.raises(ConfigError) as raised:
        load_experiments(path, config_override={"imports": ["myext.py"]})
    assert str(raised.value) == (
        "experiment 'x': --config: 'imports' is not a config field; name modules with --import MODULE"
    )


def test_a_running_ray_cannot_take_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    with pytest.raises(ConfigError, match=r"^imports: Ray is already running in this process .*\['myext.py'\]"):
        train_file(experiment(tmp_path, "  imports: [myext.py]\n"))


def test_the_setup_hook_imports_the_modules_again_in_a_fresh_process(tmp_path):
    write(tmp_path / "myext.py", MYEXT)
    imports = import_user_modules(["myext.py"], tmp_path) + import_user_modules(["json"], tmp_path)
    assert [module.name for module in imports.modules] == ["myext", "json"]
    assert UserImports().runtime_env() == {}
    hook = imports.runtime_env()["worker_process_setup_hook"]
    assert hook.__name__ == "import_user_modules"  # Ray names the hook it exports
    fresh = (
        "import sys; from ray import cloudpickle; hook = cloudpickle.loads(sys.stdin.buffer.read()); "
        "from rllib_arpo.tools.base import TOOLS; assert 'shout' not in TOOLS; hook(); print(TOOLS.get('shout'))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", fresh], input=cloudpickle.dumps(hook), capture_output=True, cwd="/", timeout=120
    )
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    assert completed.stdout.decode().strip() == "<class 'myext.Shout'>"


def test_rllib_evaluate_imports_the_experiment_files_imports(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from rllib_arpo.eval import benchmark

    evaluated = []  # the config the benchmarks would run with, checked with the tool of myext.py

    def evaluate_benchmarks(config, *args, **kwargs):
        evaluated.append(config)
        return pd.DataFrame()

    monkeypatch.setattr(benchmark, "evaluate_benchmarks", evaluate_benchmarks)
    path = experiment(tmp_path, "  imports: [myext.py]\n")
    assert main(["evaluate", "tiny", "--experiment", path, "--output", str(tmp_path / "out")]) == 0
    assert evaluated[0].tools == {"shout": {}}
    Path(path).write_text(Path(path).read_text().replace("myext.py", "nosuch.py"))
    assert main(["evaluate", "tiny", "--experiment", path]) == 2
    assert "rllib: error: experiment 'x': imports: 'nosuch.py': no such file" in capsys.readouterr().err
