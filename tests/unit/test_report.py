import json

from rllib_arpo.eval.report import evaluation_table, evaluations, write_report


def results():
    rows = []
    for iteration in (1, 2, 3):
        row = {
            "training_iteration": iteration,
            "env_runners": {"accuracy": 0.1 * iteration, "reward_mean": -1 + 0.2 * iteration},
        }
        if iteration == 1:  # evaluated before the first update
            row["evaluation_before_training"] = {"accuracy": 0.25, "format_error_rate": 0.5, "reward_mean": -0.2,
                                                 "after_iteration": 0}  # fmt: skip
        if iteration == 3:  # and after the third
            row["evaluation"] = {"accuracy": 0.5, "format_error_rate": 0.5, "reward_mean": -0.2, "after_iteration": 3}
        else:  # what RLlib's metrics logger reports in an iteration without an evaluation
            row["evaluation"] = {"accuracy": float("nan"), "after_iteration": float("nan")}
        rows.append(row)
    return rows


def test_evaluations_and_table_compare_first_and_last():
    assert [it for it, _ in evaluations(results())] == [0, 3]
    table = evaluation_table(results()).splitlines()
    assert table[0].split() == ["held-out", "split", "iteration", "0", "iteration", "3"]
    assert table[2].split() == ["accuracy", "0.250", "0.500"]
    assert "no held-out evaluation was run (set held_out_interval > 0)" in evaluation_table([{"training_iteration": 1}])


def test_an_evaluation_after_the_first_update_keeps_the_one_before_it():  # held_out_interval: 1
    rows = results()
    rows[0]["evaluation"] = {"accuracy": 0.375, "after_iteration": 1}
    assert [(it, e["accuracy"]) for it, e in evaluations(rows)] == [(0, 0.25), (1, 0.375), (3, 0.5)]


def test_write_report_makes_a_png(tmp_path):
    (tmp_path / "result.json").write_text("\n".join(json.dumps(r) for r in results()))
    table, plot = write_report(tmp_path)
    assert plot == tmp_path / "training.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "accuracy" in table
