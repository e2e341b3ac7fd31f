"""Every model family end to end: `agentrl rollout` on real Ray Serve replicas, the tool
loop on real agent-loop workers, and the gateway over real HTTP with the `openai` client.

One Ray instance for the module. Per family, one `rollout` run: the replicas are null
engines scripted with that family's turns (`server.engine.null_script`: a tool-calling
turn, with reasoning for reasoning families, then an answer, each as the family's
template writes it), the tools are `EchoArgumentsTool`s loaded from YAML, and the rows
are one `tool_agent` episode and one `external` episode whose agent drives the gateway
with the `openai` client (`agentrl.testing.fidelity.openai_tool_agent`, which checks every
parsed call and the `reasoning_content` itself). Both trajectories must be the template's
render of the conversation, token for token, with the mask exactly on the engine's turns.

Each family starts its own replicas, gateway and workers (about a minute on 2 cores), so
the default suite runs two families that between them cover both tool placements and
reasoning: SmolLM2 (tools in the system prompt, the built-in Hermes parser) and Qwen3
(the template's `tools=`, vLLM's Hermes and Qwen3 reasoning parsers). The random-
conversation property covers every family in the unit suite;
`AGENTRL_E2E_FAMILIES=all` runs this test for every family too.
"""

from __future__ import annotations

import json
import os

import pytest
import ray
import yaml
from ray import serve
from transformers import GenerationConfig

from agentrl.agent_loops.chat import first_drift
from agentrl.config import load_config
from agentrl.rollout import rollout
from agentrl.server.launch import init_ray
from agentrl.testing.families import FAMILIES, family
from agentrl.testing.fidelity import (
    TOOL_SCHEMAS,
    AssistantTurn,
    Conversation,
    FidelityHarness,
    ToolCallSpec,
    scripted_row,
    tool_result,
)

pytestmark = pytest.mark.integration

PORT = 18797
E2E_FAMILIES = (
    sorted(FAMILIES) if os.environ.get("AGENTRL_E2E_FAMILIES") == "all" else ["qwen3", "smollm2"]
)


@pytest.fixture(scope="module")
def ray_instance():
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
    init_ray(load_config(None, ["ray.num_cpus=2"]).ray)
    yield
    serve.shutdown()
    ray.shutdown()


def _conversation(reasoning: bool, parallel_calls: bool) -> Conversation:
    """Two calls (in one turn, or one a turn for formats whose turn ends at a call), then
    an answer."""
    calls = [
        ToolCallSpec(name, arguments, tool_result(name, arguments))
        for name, arguments in [
            ("search", {"query": "Grüße 数据", "limit": 3}),
            ("set_flags", {"record": 7}),
        ]
    ]
    thought = "First search, then flag." if reasoning else None
    turns = (
        [AssistantTurn("Looking.", thought, calls)]
        if parallel_calls
        else [AssistantTurn("Looking.", thought, [call]) for call in calls]
    )
    answer = AssistantTurn("Record 7 is flagged.", "Both calls worked." if reasoning else None)
    return Conversation(
        [
            {"role": "system", "content": "You look things up."},
            {"role": "user", "content": "Find the record and flag it."},
        ],
        [*turns, answer],
    )


@pytest.mark.parametrize("name", E2E_FAMILIES)
def test_family_through_replicas_workers_and_the_gateway(name, ray_instance, tmp_path):
    model = family(name)
    rendering = FidelityHarness.of(model).rendering
    tokenizer = rendering.tokenizer
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    if model.stop_tokens:  # as the family's checkpoints list them; the workers read it
        eos = tokenizer.convert_tokens_to_ids([tokenizer.eos_token, *model.stop_tokens])
        GenerationConfig(eos_token_id=eos).save_pretrained(tmp_path / "tokenizer")
    conversation = _conversation(model.reasoning_parser is not None, model.parallel_calls)
    messages, outputs = rendering.reference(conversation)
    reference = rendering.encode(rendering.render(messages, add_generation_prompt=False))
    tools = [
        {"class_name": "agentrl.testing.fidelity.EchoArgumentsTool", "tool_schema": schema}
        for schema in TOOL_SCHEMAS
    ]
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": tools}, sort_keys=False))
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path / 'tokenizer'}",
            "server.engine.backend=null",
            f"server.engine.null_script={json.dumps(outputs)}",
            "server.engine.max_model_len=8192",
            "server.num_replicas=1",
            f"server.name=family-{name}",
            f"server.http_port={PORT}",
            "gateway.enabled=true",
            f"rollout.tool_parser={model.tool_parser}",
            f"rollout.reasoning_parser={model.reasoning_parser or 'null'}",
            f"rollout.tools_in_system_prompt={str(model.tools_in_system_prompt).lower()}",
            f"rollout.tool_config_path={tmp_path / 'tools.yaml'}",
            "rollout.max_response_length=4096",
            "rollout.num_workers=1",
            "rollout.external.entrypoint=agentrl.testing.fidelity:openai_tool_agent",
            f"rollout.external.gateway_url=http://127.0.0.1:{PORT}",
            "reward.reward_fn_name=none",
        ],
    )
    row = scripted_row(conversation)
    rows = [{**row, "agent_name": "tool_agent"}, {**row, "agent_name": "external"}]
    result = rollout(cfg, rows=rows, progress=False)

    by_loop = {record["agent_name"]: record for record in result.trajectories}
    assert set(by_loop) == {"tool_agent", "external"}, result.trajectories
    engine_tokens = [t for turn in outputs for t in turn]
    prompt = rendering.encode(rendering.render(conversation.prompt, add_generation_prompt=True))
    for loop, record in by_loop.items():
        assert record["error"] is None, (loop, record["error"])
        assert record["prompt_ids"] == prompt, loop
        pairs = list(zip(record["response_ids"], record["response_mask"], strict=True))
        assert [t for t, m in pairs if m] == engine_tokens, loop
        env_text = tokenizer.decode([t for t, m in pairs if not m])
        for call in conversation.calls:  # as written, or as a JSON string (Mistral's)
            escaped = json.dumps(call.result, ensure_ascii=False)[1:-1]
            assert call.result in env_text or escaped in env_text, (loop, call.result)
    # The loop's trajectory is the template's render of the conversation, token for token;
    # so is the gateway's, unless the template writes the client's tool-call ids (Mistral):
    # those are the gateway's own ids, which no reference can know in advance.
    ids = by_loop["tool_agent"]["prompt_ids"] + by_loop["tool_agent"]["response_ids"]
    stop_ids = tokenizer.convert_tokens_to_ids(list(rendering.stop_texts))
    assert first_drift(ids, reference, stop_ids) is None and len(ids) >= len(reference) - 2
    if not rendering.renders_call_ids:
        external = by_loop["external"]
        assert external["prompt_ids"] + external["response_ids"] == ids
    metrics = by_loop["tool_agent"]["metrics"]
    assert metrics["tool_calls/ok"] == len(conversation.calls)
    assert metrics.get("tool_calls/malformed", 0) == 0
