"""The ``gymnasium`` environment on the real package: FrozenLake played to its goal with the exact
boards, slippery FrozenLake and Blackjack forked by clone and by replay over random action
sequences, and an environment with ``Text`` spaces registered here."""

import string
import threading

import gymnasium
import numpy as np
import pytest

from rllib_arpo.environments.base import resolve_environment
from rllib_arpo.environments.gymnasium_text import GymnasiumText

MOVES = ["left", "down", "right", "up"]
FROZEN_LAKE = {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False, "map_name": "4x4"}, "actions": MOVES}
SLIPPERY_LAKE = {"id": "FrozenLake-v1", "kwargs": {"is_slippery": True}, "actions": MOVES}
BLACKJACK = {"id": "Blackjack-v1", "actions": ["stick", "hit"]}


def agent(cell: str) -> str:
    """A board's cell as FrozenLake's ansi render marks the agent's: a red background."""
    return f"\x1b[41m{cell}\x1b[0m"


def test_frozen_lake_reaches_its_goal_with_the_exact_boards():
    lake = GymnasiumText(**FROZEN_LAKE)
    assert lake.reset({"seed": 0}) == f"\n{agent('S')}FFF\nFHFH\nFFFH\nHFFG\n"
    steps = [lake.step(move) for move in ["right", "right", "down", "down", "down", "right"]]
    assert [observation for observation, *_ in steps] == [
        f"  (Right)\nS{agent('F')}FF\nFHFH\nFFFH\nHFFG\n",
        f"  (Right)\nSF{agent('F')}F\nFHFH\nFFFH\nHFFG\n",
        f"  (Down)\nSFFF\nFH{agent('F')}H\nFFFH\nHFFG\n",
        f"  (Down)\nSFFF\nFHFH\nFF{agent('F')}H\nHFFG\n",
        f"  (Down)\nSFFF\nFHFH\nFFFH\nHF{agent('F')}G\n",
        f"  (Right)\nSFFF\nFHFH\nFFFH\nHFF{agent('G')}\n",
    ]
    assert [(reward, done) for _, reward, done, _ in steps] == [(0.0, False)] * 5 + [(1.0, True)]
    lake.close()


def test_text_that_names_no_action_observes_the_valid_ones_and_counts_as_a_step():
    lake = GymnasiumText(**FROZEN_LAKE, max_steps=3)
    lake.reset({"seed": 0})
    valid = "Valid actions: left, down, right, up, or an integer from 0 to 3."
    assert lake.step("jump") == (f"Invalid action 'jump'. {valid}", 0.0, False, {"invalid_action": True})
    assert lake.step(" RIGHT\n")[:3] == (f"  (Right)\nS{agent('F')}FF\nFHFH\nFFFH\nHFFG\n", 0.0, False)
    assert lake.step("4") == (f"Invalid action '4'. {valid}", 0.0, True, {"invalid_action": True})  # max_steps
    lake.reset({"seed": 0})
    assert lake.step("1")[:3] == (f"  (Down)\nSFFF\n{agent('F')}HFH\nFFFH\nHFFG\n", 0.0, False)


def play(environment: GymnasiumText, actions: list[str]) -> list[tuple]:
    """The steps of ``actions``, up to the one that ends the episode."""
    steps = []
    for action in actions:
        steps.append(environment.step(action))
        if steps[-1][2]:
            break
    return steps


@pytest.mark.parametrize(
    "options, actions", [(SLIPPERY_LAKE, [*MOVES, "jump"]), (BLACKJACK, ["stick", "hit", "jump", "jump"])]
)
def test_clone_and_replay_agree_over_random_action_sequences(options, actions):
    """For each sequence, the original plays a prefix, a clone plays the rest, then the original
    plays the rest: the two agree (clone), and a fresh instance reset with the same row and given
    the whole sequence agrees with the original (replay), which it would not had the clone's
    steps reached the original."""
    rng = np.random.default_rng(0)
    forked_mid_episode = 0
    for _ in range(30):
        row = {"seed": int(rng.integers(1_000_000))}
        sequence = [str(action) for action in rng.choice(actions, size=int(rng.integers(2, 12)))]
        split = int(rng.integers(1, len(sequence)))
        original = GymnasiumText(**options)
        first = original.reset(row)
        prefix = play(original, sequence[:split])
        rest = [] if prefix[-1][2] else sequence[split:]
        branch = original.clone()
        branched = play(branch, rest)
        continued = play(original, rest)
        assert branched == continued
        replay = GymnasiumText(**options)
        assert [replay.reset(row), *play(replay, sequence)] == [first, *prefix, *continued]
        forked_mid_episode += bool(branched)
    assert forked_mid_episode >= 5  # the clones played, not only the prefixes


class SecretWord(gymnasium.Env):
    """Guess the fruit the seed drew: ``Text`` observations and ``Text`` actions. It renders
    ``ansi`` too, which the adapter does not read: a ``Text`` observation is the text."""

    FRUITS = ("apple", "grape", "lemon", "mango", "peach")
    metadata = {"render_modes": ["ansi"]}
    observation_space = gymnasium.spaces.Text(max_length=32, charset=string.ascii_lowercase + " ")
    action_space = gymnasium.spaces.Text(max_length=8, charset=string.ascii_lowercase)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return "a rendering"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = self.FRUITS[int(self.np_random.integers(len(self.FRUITS)))]
        return "guess the fruit", {}

    def step(self, guess):
        if guess == self.secret:
            return "right", 1.0, True, False, {}
        return f"it comes {'after' if guess < self.secret else 'before'} {guess}", 0.0, False, False, {}


class LockedSecretWord(SecretWord):
    """A ``SecretWord`` holding a lock, which ``copy.deepcopy`` refuses."""

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.lock = threading.Lock()


@pytest.fixture(scope="module")
def secret_word():
    """The two test environments, registered with gymnasium while this module's tests run."""
    gymnasium.register(id="SecretWord-v0", entry_point=SecretWord)
    gymnasium.register(id="LockedSecretWord-v0", entry_point=LockedSecretWord)
    yield "SecretWord-v0"
    del gymnasium.registry["SecretWord-v0"], gymnasium.registry["LockedSecretWord-v0"]


def test_a_text_space_environment_plays_its_strings_seeded_by_the_row(secret_word):
    game = GymnasiumText(id=secret_word, action_tag="guess")
    assert game.reset({"seed": 0}) == "guess the fruit"
    assert game.step("apple") == ("it comes after apple", 0.0, False, {})
    valid = f"Valid actions: text of 1 to 8 characters from {string.ascii_lowercase}."
    assert game.step("Peach!") == (f"Invalid action 'Peach!'. {valid}", 0.0, False, {"invalid_action": True})
    assert game.step(" peach ") == ("right", 1.0, True, {})
    game.reset({})  # a row without a seed plays seed 0
    assert game.step("peach") == ("right", 1.0, True, {})
    game.reset({"seed": "1"})
    assert game.step("peach") == ("it comes before peach", 0.0, False, {})
    with pytest.raises(ValueError, match=r"^seed: expected an integer seed, got 'one'$"):
        game.reset({"seed": "one"})


def test_an_environment_that_does_not_deep_copy_forks_by_replay(secret_word):
    lake = resolve_environment({"name": "gymnasium", **FROZEN_LAKE}, 30.0)
    assert (lake.fork_method, lake.action_tag) == ("clone", "move")
    assert resolve_environment({"name": "gymnasium", **FROZEN_LAKE, "clone": False}, 30.0).fork_method == "replay"
    locked = resolve_environment({"name": "gymnasium", "id": "LockedSecretWord-v0"}, 30.0)
    assert (locked.fork_method, locked.can_fork) == ("replay", True)
    assert not hasattr(locked.build(), "clone")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"id": "FrozenLak-v1"}, r"id 'FrozenLak-v1': Environment `FrozenLak` doesn.t exist. Did you mean"),
        ({"id": "FrozenLake-v1", "kwargs": {"slippery": True}}, r"kwargs \{'slippery': True\}: .*'slippery'"),
        ({"id": "FrozenLake-v1", "actions": ["left", "right"]}, r"actions: FrozenLake-v1 has 4 actions, got 2 names"),
        ({"id": "MountainCarContinuous-v0"}, r"id 'MountainCarContinuous-v0': its action space Box.* has no text form"),
        ({"id": "FrozenLake-v1", "max_steps": 0}, r"max_steps: expected a positive integer or None, got 0"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(options, message):
    with pytest.raises(ValueError, match=rf"'gymnasium' rejects its options: {message}") as error:
        resolve_environment({"name": "gymnasium", **options}, 30.0)
    assert "\n" not in str(error.value)
