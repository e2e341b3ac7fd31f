"""The OpenEnv adapter against the real openenv-core package: an environment served by
uvicorn on a free local port, driven through openenv-core's client (reset/step/state),
whole episodes through the env loop, and a server that misbehaves."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from agentrl.config import load_config
from agentrl.core.types import SamplingParams
from agentrl.envs import EnvError, UnknownEnvError, env_factory
from agentrl.envs import openenv as openenv_adapter
from agentrl.rollout.episode import make_requests
from agentrl.rollout.worker import AgentLoopWorker
from agentrl.testing.scripted import ScriptedClient

SAMPLING = SamplingParams(max_tokens=32)

# A word-guessing environment: the target is the seed's word; each wrong guess costs 0.1
# and is told how many letters it shares. Some guesses make it misbehave.
APP = textwrap.dedent(
    """
    import time
    from typing import Any

    from openenv.core import Action, Environment, Observation, State, create_app

    WORDS = ["apple", "grape", "lemon", "mango"]


    class GuessAction(Action):
        guess: str


    class GuessObservation(Observation):
        feedback: str


    class LooseObservation(Observation):
        # What a buggy server sends: a reward and done flag of any type.
        feedback: str
        reward: Any = None
        done: Any = False


    class GuessEnv(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State(episode_id="-", step_count=0)
            self.target = WORDS[0]

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.target = WORDS[(seed or 0) % len(WORDS)]
            self._state = State(episode_id=episode_id or "e", step_count=0)
            return GuessObservation(feedback="Guess my five-letter fruit.")

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            guess = action.guess.strip().lower()
            if guess == "raise":
                raise ValueError("the fruit bowl fell over")
            if guess == "hang":
                time.sleep(5)
            if guess == "bad reward":
                return LooseObservation(feedback="?", reward="lots", done=False)
            if guess == "bad done":
                return LooseObservation(feedback="?", reward=0.0, done="maybe")
            if guess == self.target:
                return GuessObservation(feedback="Right!", reward=1.0, done=True)
            shared = len(set(guess) & set(self.target))
            return GuessObservation(feedback=f"{shared} letters in common.", reward=-0.1)

        @property
        def state(self):
            return self._state


    app = create_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8)
    """
)


@pytest.fixture(scope="module")
def app_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv_app")
    (folder / "guess_server.py").write_text(APP)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield "guess_server:app"
    openenv_adapter.stop_servers()


@pytest.fixture(scope="module")
def server(app_module):
    with openenv_adapter.LocalServer(app_module) as running:
        yield running
    assert running.process.poll() is not None  # torn down


def _say(text: str) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": []}


async def test_reset_step_and_state_through_the_client(server):
    env = env_factory(f"openenv:{server.url}")()
    messages, info = await env.reset(seed=2)
    assert messages == [{"role": "user", "content": "Guess my five-letter fruit."}]
    assert info["observation"] == {"feedback": "Guess my five-letter fruit."}
    wrong = await env.step(_say("grape"))
    assert wrong.messages == [{"role": "user", "content": "1 letters in common."}]
    assert (wrong.reward, wrong.done) == (-0.1, False)
    right = await env.step(_say("lemon"))
    assert right.terminated and right.reward == 1.0
    assert right.info["state"]["step_count"] == 2
    await env.close()
    assert env.client is None


async def test_the_env_loop_plays_an_episode_token_exact(server, make_loop, tokenizer):
    loop = make_loop(["grape", "mango"], source=f"openenv:{server.url}")
    out = await loop.run({"prompt": [], "extra_info": {"env_seed": 3}}, SAMPLING)
    assert out.extra["turn_rewards"] == [-0.1, 1.0]
    assert out.extra["stop_reason"] == "terminated" and out.reward == pytest.approx(0.9)
    assert out.metrics["tokenization_drift"] == 0
    messages = out.extra["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    # Model turns are the engine's tokens (mask 1); the feedback is the template's delta.
    eos = tokenizer.eos_token_id
    first = [*tokenizer.encode("grape", add_special_tokens=False), eos]
    delta = await loop.renderer.encode_delta([messages[2]], True)
    second = [*tokenizer.encode("mango", add_special_tokens=False), eos]
    assert out.response_ids == first + delta + second
    assert out.response_mask == [1] * len(first) + [0] * len(delta) + [1] * len(second)


async def test_an_app_source_starts_one_shared_local_server(app_module, make_loop):
    loop = make_loop(["apple"], source=f"openenv:{app_module}")
    outs = await asyncio.gather(
        *(loop.run({"prompt": [], "extra_info": {"env_seed": 0}}, SAMPLING) for _ in range(3))
    )
    assert [o.reward for o in outs] == [1.0, 1.0, 1.0]
    assert list(openenv_adapter._SERVERS) == [app_module]
    server = openenv_adapter._SERVERS[app_module]
    openenv_adapter.stop_servers()
    assert server.process.poll() is not None and not openenv_adapter._SERVERS


async def test_render_and_action_are_replaceable(server):
    env = env_factory(f"openenv:{server.url}")(
        action=lambda message: {"guess": message["content"].split()[-1]},
        render=lambda observation: f"Referee: {observation['feedback']}",
    )
    messages, _ = await env.reset(seed=0)
    assert messages[0]["content"] == "Referee: Guess my five-letter fruit."
    result = await env.step(_say("I say apple"))
    assert result.terminated and result.messages[0]["content"] == "Referee: Right!"
    await env.close()


@pytest.fixture
def worker_saying(tiny_checkpoint, tokenizer, server, scripted_turns):
    """A worker running episodes of the server whose model says ``guess``."""
    cfg = load_config(
        None,
        [
            f"model.path={tiny_checkpoint}",
            "rollout.agent_name=env",
            f"rollout.env.source=openenv:{server.url}",
            "rollout.env.step_timeout_s=1",
        ],
    )

    def make(guess: str) -> AgentLoopWorker:
        client = ScriptedClient(scripted_turns([guess]))
        return AgentLoopWorker(cfg, client=client, tools={}, tokenizer=tokenizer)

    return make


@pytest.mark.parametrize(
    ("guess", "error"),
    [
        ("raise", "raised RuntimeError: Server error: the fruit bowl fell over"),
        ("hang", "step 1 timed out after 1 s"),
        ("bad reward", "step 1 returned a non-numeric reward 'lots' (str)"),
        ("bad done", "step 1 returned terminated='maybe'; expected a bool"),
    ],
)
async def test_a_misbehaving_server_is_a_recorded_failed_episode(worker_saying, guess, error):
    rows = [{"prompt": [{"role": "user", "content": "-"}], "extra_info": {"env_seed": 0}}]
    (request,) = make_requests(rows, n=1, sampling=SAMPLING)
    result = await worker_saying(guess).run_episode(request)
    assert not result.ok and result.outputs == []
    assert result.error.startswith("EnvError: env openenv:http://127.0.0.1:")
    assert error in result.error


def test_a_source_that_names_no_server_or_app_lists_the_forms():
    with pytest.raises(UnknownEnvError, match=r"one of: http://HOST:PORT, pkg\.module:app"):
        env_factory("openenv:guess_server")
    with pytest.raises(UnknownEnvError, match="module 'no_such_openenv_module' does not import"):
        env_factory("openenv:no_such_openenv_module:app")


async def test_a_server_that_is_not_there_fails_the_reset():
    env = env_factory("openenv:http://127.0.0.1:9")()
    with pytest.raises(EnvError, match="cannot read the action schema"):
        await env.reset()


def test_an_app_that_does_not_start_says_why(tmp_path, monkeypatch):
    (tmp_path / "broken_server.py").write_text("raise ImportError('no fruit today')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        EnvError, match=r"(?s)exited with 1 before it was ready:.*ImportError: no fruit today"
    ):
        openenv_adapter.LocalServer("broken_server:app")
