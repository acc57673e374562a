"""``scripts/rl_sanity.py``'s verdict: the share of the gap to the maximum reward 0 that the last
two iterations closed, and the exit status it gives. Rewards are multiples of 1/8, so every
fraction below is exact in float64."""

import pytest


@pytest.fixture(scope="module")
def rl_sanity(load_script):
    return load_script("rl_sanity")


@pytest.mark.parametrize(
    ("curve", "fraction"),
    [
        ([-0.75, -0.5, -0.25, -0.125], 0.75),  # end = (-0.25 - 0.125) / 2; (end + 0.75) / 0.75
        ([-1.0, -0.5, 0.0], 0.75),  # the mean of the last two, not the last value
        ([-0.5, -0.25, 0.0, 0.0], 1.0),  # at the maximum
        ([-0.5, -0.5, -0.5], 0.0),  # flat
        ([-0.5, -0.75, -0.75], -0.5),  # falling: a negative share
        ([-0.5], 0.0),  # one iteration: the end is the start
        ([0.0, 0.0], 1.0),  # starts at the maximum and stays there
        ([0.0, -0.25, -0.25], 0.0),  # starts at the maximum and falls: no gap to close, no gain
    ],
)
def test_gain_fraction_is_the_share_of_the_gap_to_zero_closed(rl_sanity, curve, fraction):
    assert rl_sanity.gain_fraction(curve) == fraction


def test_a_curve_that_closes_the_needed_share_passes_with_exit_status_0(rl_sanity, capsys):
    assert rl_sanity.verdict([-0.75, -0.5, -0.25, -0.125], 0.75, minutes=1.5) == 0
    assert capsys.readouterr().out == (
        "PASS: reward -0.750 -> -0.188 (maximum 0), 75% of the gap closed (needed 75%) in 1.5 minutes\n"
    )


def test_a_curve_short_of_the_needed_share_fails_with_exit_status_1(rl_sanity, capsys):
    assert rl_sanity.verdict([-0.75, -0.5, -0.25, -0.125], 0.76, minutes=1.5) == 1
    assert capsys.readouterr().out.startswith("FAIL: reward -0.750 -> -0.188 (maximum 0), 75% of the gap closed")
    assert rl_sanity.verdict([-0.5, -0.75, -0.75], 0.0, minutes=0.5) == 1  # falling fails any gain threshold
    assert capsys.readouterr().out.startswith("FAIL: reward -0.500 -> -0.750 (maximum 0), -50% of the gap closed")
