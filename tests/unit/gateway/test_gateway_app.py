"""The gateway app in-process over a scripted engine: OpenAI clients, sessions, limits.

The scripted engine emits real Hermes tool-call text (tokenized by the tiny model's
tokenizer), so tool-call parsing and multi-turn recording run end to end; the live
Ray Serve + vLLM path is covered by tests/integration/test_gateway.py.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from agentrl.agent_loops.chat import ChatRenderer
from agentrl.testing.scripted import ScriptedClient

MODEL = "tiny"


def openai_client(http: TestClient, session_id: str | None = None, key: str = "k"):
    headers = {"x-session-id": session_id} if session_id else None
    return openai.OpenAI(
        base_url="http://gateway/v1", api_key=key, http_client=http, default_headers=headers
    )


def test_tool_call_conversation_is_recorded_as_engine_ids_plus_template_deltas(
    tokenizer, make_gateway, add_tool
):
    service, engine, http = make_gateway()
    client = openai_client(http, "conv-1")
    messages = [{"role": "user", "content": "What is 2 + 40?"}]

    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[add_tool])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 40})

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[add_tool], logprobs=True
    )
    assert second.choices[0].message.content == "The answer is 43."
    assert [t.logprob for t in second.choices[0].logprobs.content] == engine_logprobs(engine, 1)

    (sample,) = http.get("/v1/sessions/conv-1").json()["samples"]
    renderer = ChatRenderer(tokenizer, [add_tool])  # the agent loops' own delta code
    tool_delta = renderer._encode_delta(messages[-1:], True)
    turn1, turn2 = (engine_ids(engine, i) for i in (0, 1))
    assert sample["prompt_ids"] == engine.calls[0].prompt_ids
    assert sample["response_ids"] == turn1 + tool_delta + turn2
    assert sample["response_mask"] == [1] * len(turn1) + [0] * len(tool_delta) + [1] * len(turn2)
    assert engine.calls[1].prompt_ids == sample["prompt_ids"] + turn1 + tool_delta
    assert service.store.get("conv-1").metrics()["gateway/reused_prompt_tokens"] > 0


def engine_ids(engine: ScriptedClient, turn: int) -> list[int]:
    return engine.script("", turn, [])


def engine_logprobs(engine: ScriptedClient, turn: int) -> list[float]:
    return [-(i + 1) / 100 for i in range(len(engine_ids(engine, turn)))]


async def test_async_client_with_session_path_prefix(make_gateway, add_tool):
    _, engine, http = make_gateway()
    transport = httpx.ASGITransport(app=http.app)
    client = openai.AsyncOpenAI(
        base_url="http://gateway/sessions/path-1/v1",
        api_key="k",
        http_client=httpx.AsyncClient(transport=transport),
    )
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[add_tool]
    )
    assert reply.choices[0].message.tool_calls
    assert engine.calls[0].session_id == "path-1"
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_streamed_tool_call_reassembles_and_is_recorded(make_gateway, add_tool):
    _, _, http = make_gateway()
    client = openai_client(http, "stream-1")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "add"}],
        tools=[add_tool],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [c for chunk in chunks for ch in chunk.choices for c in ch.delta.tool_calls or []]
    finish = [ch.finish_reason for chunk in chunks for ch in chunk.choices if ch.finish_reason]
    assert [c.function.name for c in calls] == ["add"]
    assert finish == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens > 0
    assert len(http.get("/v1/sessions/stream-1").json()["samples"]) == 1


def test_stop_string_cuts_text_but_keeps_the_produced_tokens(tokenizer, make_gateway):
    def script(session_id, turn, prompt_ids):
        return [*tokenizer.encode("alpha beta STOP gamma"), tokenizer.eos_token_id]

    _, _, http = make_gateway(script)
    reply = openai_client(http, "stop-1").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], stop=["STOP"]
    )
    assert reply.choices[0].message.content == "alpha beta "
    assert reply.choices[0].finish_reason == "stop"
    (sample,) = http.get("/v1/sessions/stop-1").json()["samples"]
    assert "STOP" in tokenizer.decode(sample["response_ids"])
    assert "gamma" not in tokenizer.decode(sample["response_ids"])


def test_text_completions_reuse_ids_when_the_prompt_extends_a_call(tokenizer, make_gateway):
    _, engine, http = make_gateway()
    client = openai_client(http, "text-1")
    first = client.completions.create(model=MODEL, prompt="Question: 2 + 40 =", max_tokens=8)
    prompt = "Question: 2 + 40 =" + first.choices[0].text + "\nObservation: 42\n"
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)
    (sample,) = http.get("/v1/sessions/text-1").json()["samples"]
    assert engine.calls[1].prompt_ids[: len(engine.calls[0].prompt_ids)] == (
        engine.calls[0].prompt_ids
    )
    assert sample["response_mask"].count(0) == len(tokenizer.encode("\nObservation: 42\n"))


def test_generate_endpoint_returns_ids_logprobs_versions_and_records(make_gateway):
    _, engine, http = make_gateway()
    body = {"prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0.0}
    reply = http.post("/v1/generate", json=body, headers={"x-session-id": "gen-1"}).json()
    assert len(reply["token_ids"]) == len(reply["logprobs"]) == len(reply["token_versions"]) == 4
    assert engine.calls[0].sampling.max_tokens == 4
    (sample,) = http.get("/v1/sessions/gen-1").json()["samples"]
    assert sample["response_ids"] == reply["token_ids"]


def test_max_tokens_beyond_the_context_window_is_refused(make_gateway):
    _, engine, http = make_gateway()
    reply = http.post("/v1/generate", json={"prompt_ids": [5] * 1000, "max_tokens": 500})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "max_tokens"
    assert engine.calls == []
    too_long = http.post("/v1/generate", json={"prompt_ids": [5] * 1024})
    assert too_long.status_code == 400
    assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_rewards_and_finish_deliver_the_session_to_the_sink(make_gateway):
    service, _, http = make_gateway()
    client = openai_client(http, "rw-1")
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
    assert http.post("/v1/sessions/rw-1/reward", json={"rewards": {reply.id: 0.5}}).is_success
    bad = http.post("/v1/sessions/rw-1/reward", json={"rewards": {"nope": 1.0}})
    assert bad.status_code == 400
    done = http.post("/v1/sessions/rw-1/finish", json={"reward": 1.0}).json()
    assert done["finished"] and done["samples"][0]["reward"] == 1.0
    ((session_id, samples, reward),) = service.sink.drain()
    assert (session_id, reward, samples[0].extra["turn_rewards"]) == ("rw-1", 1.0, [0.5])
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])


def test_api_key_is_required_when_configured(make_gateway):
    _, _, http = make_gateway(api_key="secret")
    with pytest.raises(openai.AuthenticationError):
        openai_client(http, key="wrong").models.list()
    assert http.get("/v1/models").status_code == 401
    assert openai_client(http, key="secret").models.list().data[0].id == MODEL
    _, _, open_http = make_gateway()
    assert openai_client(open_http, key="anything").models.list().data[0].id == MODEL


def test_oversized_body_is_refused_with_413(make_gateway):
    _, engine, http = make_gateway(max_body_bytes=2048)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 4096}]}
    reply = http.post("/v1/chat/completions", json=big)
    assert reply.status_code == 413
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert not engine.calls


BAD_BODIES = [
    (b"{", 400),
    (b"[]", 400),
    (b'"text"', 400),
    (b'{"model": "tiny"}', 400),
    (b'{"model": "tiny", "messages": []}', 400),
    (b'{"model": "tiny", "messages": "hi"}', 400),
    (b'{"model": "other", "messages": [{"role": "user", "content": "hi"}]}', 404),
    (b'{"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": 5}]}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 0}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 99}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user"}], "temperature": -1}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user"}], "temperature": NaN}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user"}], "top_p": 0}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user"}], "max_tokens": "many"}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user"}], "tools": [{"type": "x"}]}', 400),
]


@pytest.mark.parametrize(("body", "status"), BAD_BODIES)
def test_bad_chat_requests_get_openai_style_4xx(make_gateway, body, status):
    _, engine, http = make_gateway()
    reply = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"]
    assert not engine.calls


def test_bad_session_ids_and_unknown_sessions_are_4xx(make_gateway):
    _, _, http = make_gateway()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert (
        http.post("/v1/chat/completions", json=body, headers={"x-session-id": "a b"}).status_code
        == 400
    )
    assert (
        http.post(
            "/sessions/a/v1/chat/completions", json=body, headers={"x-session-id": "b"}
        ).status_code
        == 400
    )
    assert http.get("/v1/sessions/missing").status_code == 404
    assert http.post("/v1/sessions/missing/finish").status_code == 404
    assert http.post("/v1/sessions/missing/reward", json={}).status_code == 400
