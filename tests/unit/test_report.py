import json

from rllib_arpo.eval.report import evaluation_table, evaluations, time_split, time_table, write_report

NAN = float("nan")


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
    assert "accuracy" in table and "where the time went" not in table  # these rows are not timed
    rows = [{**row, **timed(2.0, 1.0, 0.0, 0.5, 0.0)} for row in results()]
    (tmp_path / "result.json").write_text("\n".join(json.dumps(r) for r in rows))
    table, _ = write_report(tmp_path)
    assert table.split("\n\n")[1] == time_table(rows)


def timed(iteration: float, generation: float, tools: float, learner: float, sync: float) -> dict:
    """A result row with an iteration's seconds and the parts the run times (NaN: not timed)."""
    return {
        "time_this_iter_s": iteration,
        "env_runners": {"generation_s": generation, "tool_s": tools},
        "learner_update_s": learner,
        "weight_sync_s": sync,
    }


def test_the_time_split_sums_each_part_over_the_iterations_and_names_the_rest():
    rows = [timed(10.0, 3.0, 0.5, 4.0, 0.25), timed(6.0, 2.0, 0.5, 2.5, NAN)]
    # 16 s in all: generation 5, tools 1, learner 6.5, sync 0.25, the rest 3.25
    assert time_split(rows) == [
        ("generation", 5.0, 0.3125),
        ("tool calls", 1.0, 0.0625),
        ("learner updates", 6.5, 0.40625),
        ("weight sync", 0.25, 0.015625),
        ("everything else", 3.25, 0.203125),
        ("all iterations", 16.0, 1.0),
    ]
    assert time_table(rows).splitlines()[2].split() == ["generation", "5.0", "31.2%"]


def test_sampling_that_overlaps_the_update_leaves_no_rest_and_no_timing_no_table():
    overlapped = [timed(4.0, 3.0, 0.0, 2.0, 0.0)]  # max_staleness >= 1: the rollout ran beside the update
    assert [part for part, _, _ in time_split(overlapped)] == [
        "generation", "tool calls", "learner updates", "weight sync", "all iterations",
    ]  # fmt: skip
    assert time_split([{"training_iteration": 1}]) == [] and time_table([{"training_iteration": 1}]) == ""
