"""``scripts/gpu_check.py``'s stages: a stage that fails, hangs, leaves unreadable figures or finds
the budget spent is reported as such, and the report is written all the same."""

import sys

from rllib_arpo.gpu_check.outcomes import FAIL, PASS


def _python(code: str):
    return lambda out: [sys.executable, "-c", code]


def test_each_outcome_of_a_stage_is_reported(load_script, tmp_path):
    script = load_script("gpu_check")
    Stage, run_stage = script.Stage, script.run_stage
    ok = Stage("ok", _python("print('figures')"), lambda out: {"log": (out / "ok.log").read_text()}, timeout_s=60)
    fails = Stage("fails", _python("raise SystemExit(3)"), lambda out: {}, timeout_s=60)
    hangs = Stage("hangs", _python("import time; time.sleep(60)"), lambda out: {}, timeout_s=0.5)
    unreadable = Stage("unreadable", _python("pass"), lambda out: (out / "missing.json").read_text(), timeout_s=60)
    results = {stage.name: run_stage(stage, tmp_path, seconds_left=60) for stage in (ok, fails, hangs, unreadable)}
    assert {name: (r.status, r.note, r.figures) for name, r in results.items()} == {
        "ok": (PASS, "", {"log": "figures\n"}),
        "fails": (FAIL, "exit status 3", {}),
        "hangs": ("TIMEOUT", "stopped after 0 s", {}),
        "unreadable": (
            PASS, f"figures unreadable: FileNotFoundError: [Errno 2] No such file or directory: "
            f"'{tmp_path / 'missing.json'}'", {},
        ),
    }  # fmt: skip
    spent = run_stage(ok, tmp_path, seconds_left=0)
    assert (spent.status, spent.note, spent.seconds) == ("TIMEOUT", "no time left in the budget", 0.0)


def test_a_stage_gets_no_more_than_the_budget_left(load_script, tmp_path):
    script = load_script("gpu_check")
    hangs = script.Stage("hangs", _python("import time; time.sleep(60)"), lambda out: {}, timeout_s=600)
    result = script.run_stage(hangs, tmp_path, seconds_left=0.5)
    assert (result.status, result.note) == ("TIMEOUT", "stopped after 0 s")
