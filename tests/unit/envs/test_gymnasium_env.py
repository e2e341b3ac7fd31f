"""The Gymnasium adapter against the real gymnasium package: the toy-text environments'
text, their action names, replaceable renderers and parsers, and whole episodes."""

from __future__ import annotations

import textwrap

import gymnasium
import pytest

from agentrl.core.types import SamplingParams
from agentrl.envs import EnvError, UnknownEnvError, env_factory
from agentrl.envs.gymnasium import GymnasiumEnv, parse_named_action

SAMPLING = SamplingParams(max_tokens=32)
# FrozenLake's 4x4 map SFFF/FHFH/FFFH/HFFG: the way to the goal around the holes.
PATH = ["down", "down", "right", "right", "down", "right"]


def _say(text: str) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": []}


def test_frozen_lake_reads_as_its_map_with_the_player_and_moves_by_name():
    env = env_factory("gymnasium:FrozenLake-v1")(is_slippery=False)
    messages, _ = env.reset(seed=0)
    (message,) = messages
    assert message["role"] == "user"
    assert "Answer with one action: left, down, right, up." in message["content"]
    assert message["content"].endswith("PFFF\nFHFH\nFFFH\nHFFG\nYou are at row 0, column 0.")
    result = env.step(_say("I will go right."))
    assert result.messages[0]["content"].endswith(
        "SPFF\nFHFH\nFFFH\nHFFG\nYou are at row 0, column 1."
    )
    assert (result.reward, result.terminated, result.truncated) == (0, False, False)


def test_frozen_lake_pays_one_at_the_goal():
    env = env_factory("gymnasium:FrozenLake-v1")(is_slippery=False)
    env.reset(seed=0)
    results = [env.step(_say(f"Move {move}.")) for move in PATH]
    assert [r.reward for r in results] == [0, 0, 0, 0, 0, 1]
    assert [r.terminated for r in results] == [False] * 5 + [True]


def test_the_last_action_named_counts_whatever_its_case():
    names = ("left", "down", "right", "up")
    assert parse_named_action("not left but RIGHT", names) == 2
    assert parse_named_action("upward is no word here", names) is None


def test_a_turn_without_an_action_is_answered_and_earns_the_invalid_action_reward():
    env = env_factory("gymnasium:FrozenLake-v1")(invalid_action_reward=-0.5)
    env.reset(seed=0)
    result = env.step(_say("I am not sure."))
    assert result.reward == -0.5 and not result.done and result.info["invalid_action"]
    assert result.messages == [
        {
            "role": "user",
            "content": "That is not an action. Answer with one of: left, down, right, up.",
        }
    ]


def test_taxi_shows_the_taxi_the_passenger_and_the_destination_of_the_real_state():
    env = env_factory("gymnasium:Taxi-v4")()
    messages, _ = env.reset(seed=3)
    row, col, passenger, destination = env.env.unwrapped.decode(env.env.unwrapped.s)
    text = messages[0]["content"]
    assert f"The taxi is at row {row}, column {col}." in text
    assert f"the destination is {'RGYB'[destination]}." in text
    assert f"waiting at {'RGYB'[passenger]}" in text
    map_lines = text.split("\n\n", 1)[1].splitlines()
    assert map_lines[1 + row][2 * col + 1] == "T"
    # Seed 3 starts the taxi away from the passenger: a pickup there is illegal (-10).
    assert (row, col) != env.env.unwrapped.locs[passenger]
    assert env.step(_say("pickup")).reward == -10


def test_blackjack_reads_the_hand_and_ends_on_stick():
    env = env_factory("gymnasium:Blackjack-v1")()
    messages, _ = env.reset(seed=1)
    total, dealer, ace = env.env.unwrapped._get_obs()
    hand = f"Your cards sum to {total}{' with a usable ace' if ace else ''}."
    assert messages[0]["content"].endswith(f"{hand} The dealer shows {dealer}.")
    result = env.step(_say("I stick."))
    assert result.terminated and result.reward in (-1.0, 0.0, 1.0)


def test_cliff_walking_marks_the_cliff_and_sends_a_faller_back():
    env = env_factory("gymnasium:CliffWalking-v1")()
    messages, _ = env.reset(seed=0)
    assert "PCCCCCCCCCCG" in messages[0]["content"]
    assert env.step(_say("right")).reward == -100


def test_other_discrete_environments_take_the_action_number():
    env = env_factory("gymnasium:CartPole-v1")()
    messages, _ = env.reset(seed=0)
    assert "Answer with one action: 0, 1." in messages[0]["content"]
    assert "Observation: [" in messages[0]["content"]
    assert env.step(_say("1")).reward == 1.0


def test_a_continuous_action_space_needs_a_parser():
    with pytest.raises(EnvError, match=r"Box\(.*\) action space: give an action parser"):
        env_factory("gymnasium:MountainCarContinuous-v0")()


def test_renderer_parser_and_instructions_are_replaceable_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "lake_text.py").write_text(
        textwrap.dedent(
            """
            def render(observation, env):
                return f"cell {observation} of {env.nrow * env.ncol}"

            def parse(text, env):
                return {"W": 0, "S": 1, "E": 2, "N": 3}.get(text.strip()[-1:])
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = env_factory("gymnasium:FrozenLake-v1")(
        render="lake_text:render", parse="lake_text:parse", instructions="Walk.", is_slippery=False
    )
    messages, _ = env.reset(seed=0)
    assert messages == [{"role": "user", "content": "Walk.\n\ncell 0 of 16"}]
    assert env.step(_say("go E")).messages[0]["content"] == "cell 1 of 16"
    assert "not an action" in env.step(_say("go right")).messages[0]["content"]


def test_a_renderer_that_does_not_import_is_a_clear_error():
    with pytest.raises(EnvError, match="gymnasium render 'no_such_module:render' does not import"):
        GymnasiumEnv("FrozenLake-v1", render="no_such_module:render")


def test_an_unknown_id_lists_the_closest_registered_ones():
    with pytest.raises(UnknownEnvError, match=r"closest: Taxi-v4.*available_envs\('gymnasium'\)"):
        env_factory("gymnasium:Taxi-v3")
    assert "Taxi-v3" not in gymnasium.registry  # the real registry agrees


async def test_the_env_loop_walks_frozen_lake_to_the_goal(make_loop):
    loop = make_loop(
        [f"I go {move}." for move in PATH],
        source="gymnasium:FrozenLake-v1",
        kwargs={"is_slippery": False},
    )
    out = await loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING)
    assert out.extra["turn_rewards"] == [0.0] * 5 + [1.0]
    assert out.extra["stop_reason"] == "terminated" and out.reward == 1.0
    assert out.metrics["tokenization_drift"] == 0
    assert out.extra["messages"][-1]["content"].endswith("You are at row 3, column 3.")
