"""Template fidelity: random tool-calling conversations through the tool loop and the
gateway, for any model family, checked token for token.

A conversation is a system prompt (sometimes), a user message, assistant turns with
reasoning (for reasoning families), content and tool calls (parallel ones too), the
tools' results, and a final answer. A scripted engine emits each assistant turn as the
family's chat template writes it, tokenized on its own (as a model trained on that
template samples it). Each run checks that

- the trajectory's ids equal the template's render of the whole conversation, token for
  token (``drifted_tokens`` counts the ids from the first difference on);
- the loop's own drift check, run on every episode, finds that the conversation it kept
  as messages re-renders to its ids (``drift_reports``: episodes it reported drift for);
- the mask is 1 exactly on the engine's tokens (``mask_errors``);
- the parser recovered every call the scripted model made, with its arguments
  (``unparsed_calls``);
- the gateway, driven as an OpenAI client drives it (assistant messages echoed with
  their ``reasoning_content`` and ``tool_calls``), records one sample that is exactly
  what the engine saw (the last call's prompt plus its completion) and the template's
  render of the conversation (unless the template writes the client's tool-call ids).

``tests/unit/test_template_fidelity.py`` runs a sample of this with hypothesis;
``bench/template_fidelity.py`` runs 10,000 conversations per family.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.agent_loops.base import AgentLoopContext
from agentrl.agent_loops.chat import ChatRenderer, first_drift
from agentrl.agent_loops.config import RolloutConfig
from agentrl.agent_loops.tool_agent import ToolAgentLoop
from agentrl.core.types import SamplingParams
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools import BaseTool, ToolResponse
from agentrl.tools.parsers import get_tool_parser
from agentrl.tools.reasoning import get_reasoning_parser
from agentrl.tools.render import place_tools, with_tools_system_prompt

if TYPE_CHECKING:
    from agentrl.testing.families import ModelFamily

Message = dict[str, Any]

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_flags",
            "description": "Set flags on a record.",
            "parameters": {
                "type": "object",
                "properties": {
                    "record": {"type": "integer"},
                    "flags": {"type": "array", "items": {"type": "string"}},
                    # Typed: Gemma's bare values in an untyped object come back as text
                    # (vLLM's gemma4 parser types them by the schema).
                    "options": {
                        "type": "object",
                        "properties": {"mode": {"type": "string"}, "n": {"type": "integer"}},
                    },
                    "enabled": {"type": "boolean"},
                },
                "required": ["record"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "now",
            "description": "The current time.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]

# Plain text for contents and argument strings: letters, digits, punctuation and
# non-ASCII, no markup (a call format cannot tell an argument's own tag from its end).
_WORDS = [
    "alpha",
    "beta",
    "Grüße",
    "naïve",
    "数据",
    "emoji😀",
    "x=1;",
    "a, b.",
    "(see 3)",
    "don't",
    '"quoted"',
    "back\\slash",
    "42",
    "-7.5",
    "tab\tsep",
]


@dataclass
class ToolCallSpec:
    """One call the scripted model makes, and the result its tool returns."""

    name: str
    arguments: dict[str, Any]
    result: str


@dataclass
class AssistantTurn:
    """One scripted model turn: reasoning (or None), content, calls."""

    content: str
    reasoning: str | None = None
    calls: list[ToolCallSpec] = field(default_factory=list)


@dataclass
class Conversation:
    """A scripted episode: the prompt messages and the model's turns (the last answers)."""

    prompt: list[Message]
    turns: list[AssistantTurn]

    @property
    def calls(self) -> list[ToolCallSpec]:
        return [call for turn in self.turns for call in turn.calls]


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _tool_result(rng: random.Random, specials: list[str]) -> str:
    kind = rng.choice(["text", "empty", "long", "json", "special", "unicode", "lines"])
    if kind == "empty":
        return ""
    if kind == "long":
        return _text(rng, 300, 600)
    if kind == "json":
        return json.dumps({"ok": rng.random() < 0.5, "items": [_text(rng, 1, 3)]})
    if kind == "special":
        return f"{_text(rng, 0, 3)} {rng.choice(specials)} {_text(rng, 0, 3)}"
    if kind == "unicode":
        return "".join(rng.choice("äöü€漢字🙂ñ\u200b") for _ in range(rng.randint(1, 20)))
    if kind == "lines":
        return "\n".join(_text(rng, 1, 4) for _ in range(rng.randint(2, 5)))
    return _text(rng, 1, 12)


def _arguments(rng: random.Random, name: str) -> dict[str, Any]:
    if name == "search":
        arguments: dict[str, Any] = {"query": _text(rng, 1, 5)}
        if rng.random() < 0.5:
            arguments["limit"] = rng.randint(-5, 1000)
        return arguments
    if name == "set_flags":
        arguments = {"record": rng.randint(0, 10**6)}
        if rng.random() < 0.6:
            arguments["flags"] = [rng.choice(string.ascii_lowercase) * 3 for _ in range(3)]
        if rng.random() < 0.4:
            arguments["options"] = {"mode": rng.choice(["fast", "slow"]), "n": rng.randint(0, 9)}
        if rng.random() < 0.4:
            arguments["enabled"] = rng.random() < 0.5
        return arguments
    return {}


def random_conversation(
    rng: random.Random,
    specials: list[str],
    reasoning: bool,
    max_tool_turns: int = 3,
    max_calls_per_turn: int = 3,
) -> Conversation:
    """A random conversation; ``specials`` are the template's own special strings (tool
    results sometimes contain one); ``reasoning``: turns think first (sometimes empty);
    ``max_calls_per_turn``: 1 for formats whose turn ends at each call (Harmony)."""
    prompt: list[Message] = []
    if rng.random() < 0.5:
        prompt.append({"role": "system", "content": _text(rng, 1, 10)})
    prompt.append({"role": "user", "content": _text(rng, 1, 15)})
    turns = []
    results: dict[str, str] = {}  # a repeated call gets the same result
    for _ in range(rng.randint(0, max_tool_turns)):
        calls = []
        for name in rng.choices(
            ["search", "set_flags", "now"], k=rng.randint(1, max_calls_per_turn)
        ):
            arguments = _arguments(rng, name)
            key = _call_key(name, arguments)
            result = results.setdefault(key, _tool_result(rng, specials))
            calls.append(ToolCallSpec(name, arguments, result))
        content = _text(rng, 1, 8) if rng.random() < 0.4 else ""
        turns.append(AssistantTurn(content, _reasoning(rng, reasoning), calls))
    turns.append(AssistantTurn(_text(rng, 1, 20), _reasoning(rng, reasoning)))
    return Conversation(prompt, turns)


def _reasoning(rng: random.Random, reasoning: bool) -> str | None:
    if not reasoning:
        return None
    return _text(rng, 1, 25)


@dataclass
class FidelityReport:
    """What one conversation's run found (all zero: token-exact)."""

    drifted_tokens: int = 0
    mask_errors: int = 0
    unparsed_calls: int = 0
    gateway_mismatches: int = 0
    drift_reports: int = 0
    detail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.drifted_tokens
            or self.mask_errors
            or self.unparsed_calls
            or self.gateway_mismatches
            or self.drift_reports
        )


class FamilyRendering:
    """A family's template applied the way agentrl applies it: tools placed as the loops
    place them, assistant turns as the family's model writes them."""

    def __init__(
        self,
        tokenizer: Any,
        tools_in_system_prompt: bool | None,
        stop_tokens: tuple[str, ...] = (),
        answer_stop: str | None = None,
        call_ids: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_tools, self.system_prompt = place_tools(
            tokenizer, TOOL_SCHEMAS, tools_in_system_prompt
        )
        self.calls_in_content = self.system_prompt is not None
        # The texts that end a model turn: the eos token and the format's and the model's
        # other stop tokens (Harmony's <|call|> besides <|return|>, GLM's <|observation|>).
        self.stop_tokens = stop_tokens
        self.stop_texts = (tokenizer.eos_token, *stop_tokens)
        # The token that ends an answer when the template writes no end-of-turn text.
        self.answer_stop = answer_stop
        # The ids the family's models write for their calls (ModelFamily.call_ids).
        self.call_ids = call_ids

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.template_tools:
            kwargs["tools"] = self.template_tools
        messages = with_tools_system_prompt(messages, self.system_prompt)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @functools.cached_property
    def renders_call_ids(self) -> bool:
        """Whether the template writes a tool result's ``tool_call_id`` (Mistral's): a
        client's ids, which no reference conversation can know in advance. Not so for a
        family whose models write their calls' ids (Kimi K2's): its results name those."""
        if self.call_ids is not None:
            return False
        turn = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        tool = {"role": "tool", "name": "now", "content": "r"}  # Harmony needs the name
        plain = self.render([*turn, tool], False)
        with_id = [*turn, {**tool, "tool_call_id": "call12345"}]
        return self.render(with_id, False) != plain

    def assistant_message(self, turn: AssistantTurn, calls_before: int = 0) -> Message:
        """The turn as a chat message (structured calls, or Hermes blocks in the content
        for templates that ignore ``tool_calls`` and read tools from the system prompt);
        ``calls_before``: the conversation's calls before the turn (ids count them)."""
        message: Message = {"role": "assistant", "content": turn.content}
        if turn.reasoning is not None:
            message["reasoning_content"] = turn.reasoning
        if not turn.calls:
            return message
        if self.calls_in_content:
            blocks = (
                "<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
                + "\n</tool_call>"
                for c in turn.calls
            )
            message["content"] = "\n".join([turn.content, *blocks]).lstrip("\n")
        else:
            # The family's own ids, else ids of 9 letters and digits, as Mistral's formats
            # require (templates that write ids write these into the model's turn; the
            # others ignore them).
            message["tool_calls"] = [
                {
                    "id": self._call_id(c.name, calls_before + i),
                    "type": "function",
                    "function": {"name": c.name, "arguments": copy.deepcopy(c.arguments)},
                }
                for i, c in enumerate(turn.calls)
            ]
        return message

    def _call_id(self, name: str, index: int) -> str:
        if self.call_ids is None:
            return f"call{index:05d}"
        return self.call_ids.format(name=name, index=index)

    def turn_ids(
        self, history: list[Message], message: Message, following: list[Message] | None = None
    ) -> list[int]:
        """The engine's ids for ``message`` after ``history``: the template's text for the
        turn, through its first stop token (where the engine stops), tokenized on its own.

        A template that writes no end-of-turn text (GLM's) leaves the stop to the opening
        of the next turn: the model stops at the token that begins the render of
        ``following`` (the turn's tool results), or at ``answer_stop`` after an answer."""
        before = self.render(history, add_generation_prompt=True)
        after = self.render([*history, message], add_generation_prompt=False)
        if not after.startswith(before):
            raise AssertionError("the template renders the history differently after a turn")
        text = after[len(before) :]
        if self._first_stop(text) is None:
            text += self._next_opening(after, [*history, message, *(following or [])])
        found = self._first_stop(text)
        if found is None:
            raise AssertionError(f"the assistant turn does not end with one of {self.stop_texts}")
        return self.encode(text[:found])

    def _first_stop(self, text: str) -> int | None:
        """Where the first stop text in ``text`` ends; None if there is none."""
        ends = [at + len(stop) for stop in self.stop_texts if (at := text.find(stop)) >= 0]
        return min(ends, default=None)

    def _next_opening(self, rendered: str, conversation: list[Message]) -> str:
        """The stop text that opens the turn after ``rendered`` in ``conversation``."""
        if conversation[-1]["role"] == "assistant":
            return self.answer_stop or ""
        full = self.render(conversation, add_generation_prompt=False)
        tail = full[len(rendered) :] if full.startswith(rendered) else ""
        return next((stop for stop in self.stop_texts if tail.startswith(stop)), "")

    def reference(self, conversation: Conversation) -> tuple[list[Message], list[list[int]]]:
        """The whole conversation as messages, and the engine's ids for each turn."""
        messages = [dict(m) for m in conversation.prompt]
        outputs = []
        calls_before = 0
        for turn in conversation.turns:
            message = self.assistant_message(turn, calls_before)
            calls_before += len(turn.calls)
            results = [{"role": "tool", "content": call.result} for call in turn.calls]
            if self.call_ids is not None:
                # The model wrote each call's id: its result names it, as the loop's do.
                for result, call in zip(results, message.get("tool_calls", []), strict=True):
                    result["tool_call_id"] = call["id"]
            outputs.append(self.turn_ids(messages, message, results))
            messages.append(message)
            messages.extend(results)
        return messages, outputs


class _ScriptedTool(BaseTool):
    """Returns the scripted result of each call, and records the calls it got."""

    def __init__(self, schema: dict[str, Any], harness: FidelityHarness) -> None:
        super().__init__(tool_schema=schema)
        self._harness = harness

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        self._harness.executed.append((self.name, parameters))
        key = _call_key(self.name, parameters)
        text = self._harness.results.get(key, f"no result for {key}")
        return ToolResponse(text=text), 0.0, {}


def _call_key(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps([name, arguments], sort_keys=True, ensure_ascii=False)


def _missing(expected: list[tuple[str, dict]], got: list[tuple[str, dict]]) -> int:
    remaining = [_call_key(n, a) for n, a in got]
    missing = 0
    for name, arguments in expected:
        key = _call_key(name, arguments)
        if key in remaining:
            remaining.remove(key)
        else:
            missing += 1
    return missing


class FidelityHarness:
    """One family's tokenizer and parsers, set up once, checking conversation after
    conversation through the tool loop and the gateway."""

    def __init__(
        self,
        tokenizer: Any,
        tools_in_system_prompt: bool | None,
        tool_parser: str,
        reasoning_parser: str | None,
        stop_tokens: tuple[str, ...] = (),
        call_ids: str | None = None,
    ) -> None:
        """``stop_tokens``: the model's stop tokens besides eos, as its generation config
        lists them (``ModelFamily.stop_tokens``); the first ends an answer when the
        template writes no end of turn. ``call_ids``: the ids its models write for their
        calls (``ModelFamily.call_ids``)."""
        from agentrl.server.gateway.config import GatewayConfig
        from agentrl.server.gateway.service import GatewayService
        from agentrl.server.gateway.sink import InMemorySink

        self.tool_parser = get_tool_parser(tool_parser, tokenizer, TOOL_SCHEMAS)
        stops = (*self.tool_parser.end_of_turn_tokens, *stop_tokens)
        answer_stop = stop_tokens[0] if stop_tokens else None
        self.rendering = FamilyRendering(
            tokenizer, tools_in_system_prompt, stops, answer_stop, call_ids
        )
        self.reasoning_parser = get_reasoning_parser(reasoning_parser, tokenizer)
        self.renderer = ChatRenderer(
            tokenizer,
            self.rendering.template_tools,
            self.rendering.system_prompt,
            stop_tokens=stops,
        )
        self.tools: dict[str, BaseTool] = {
            s["function"]["name"]: _ScriptedTool(s, self) for s in TOOL_SCHEMAS
        }
        self.results: dict[str, str] = {}
        self.executed: list[tuple[str, dict[str, Any]]] = []
        self._outputs: list[list[int]] = []
        self.engine = ScriptedClient(lambda _session, turn, _prompt: self._outputs[turn])
        self.sink = InMemorySink()
        config = GatewayConfig(
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
            tools_in_system_prompt=self.rendering.calls_in_content,
            default_max_tokens=1 << 16,
            # One conversation at a time, each finished before the next: a few sessions
            # (the default keeps 10,000 finished ones, each with its ids, for an hour).
            max_sessions=8,
        )
        self.gateway = GatewayService(self.engine, tokenizer, config, "m", 1 << 20, self.sink)
        self._episodes = 0

    @classmethod
    def of(cls, family: ModelFamily, tool_parser: str | None = None) -> FidelityHarness:
        """The harness of a built-in family (``tool_parser``: another parser name for its
        format, e.g. ``vllm:hermes`` for ``hermes``)."""
        return cls(
            family.tokenizer(),
            family.tools_in_system_prompt,
            tool_parser or family.tool_parser,
            family.reasoning_parser,
            family.stop_tokens,
            family.call_ids,
        )

    def _start(self, conversation: Conversation) -> tuple[str, list[Message], list[list[int]]]:
        """A fresh session id, and the conversation's reference messages and outputs."""
        self._episodes += 1
        messages, self._outputs = self.rendering.reference(conversation)
        self.results = {_call_key(c.name, c.arguments): c.result for c in conversation.calls}
        self.executed = []
        # Only this conversation's calls are read: kept for a whole run (100,000
        # conversations), every earlier prompt would grow the process by gigabytes.
        self.engine.calls.clear()
        return f"episode-{self._episodes}", messages, self._outputs

    async def check(self, conversation: Conversation) -> FidelityReport:
        """Both checks on one conversation, in one report."""
        report = await self.check_tool_loop(conversation)
        gateway = await self.check_gateway(conversation)
        report.drifted_tokens += gateway.drifted_tokens
        report.unparsed_calls += gateway.unparsed_calls
        report.mask_errors += gateway.mask_errors
        report.gateway_mismatches += gateway.gateway_mismatches
        report.detail += gateway.detail
        return report

    async def check_tool_loop(self, conversation: Conversation) -> FidelityReport:
        """Run ``ToolAgentLoop`` on the conversation against the scripted engine."""
        report = FidelityReport()
        session, messages, outputs = self._start(conversation)
        rendering = self.rendering
        reference = rendering.encode(rendering.render(messages, add_generation_prompt=False))
        config = RolloutConfig(
            max_response_length=1 << 20,
            max_tool_response_length=1 << 20,
            max_assistant_turns=len(outputs) + 1,
            max_user_turns=len(outputs) + 1,
            # Every episode: the conversation the loop keeps as messages must re-render
            # to its own ids, or the drift check would report drift that is not there.
            drift_check_rate=1.0,
        )
        context = AgentLoopContext(
            client=self.engine,
            tokenizer=rendering.tokenizer,
            renderer=self.renderer,
            tools=self.tools,
            tool_parser=self.tool_parser,
            config=config,
            session_id=session,
            reasoning_parser=self.reasoning_parser,
        )
        out = await ToolAgentLoop(context).run(
            {"prompt": conversation.prompt}, SamplingParams(max_tokens=1 << 16)
        )
        ids = out.prompt_ids + out.response_ids
        if out.metrics.get("tokenization_drift"):
            report.drift_reports = 1
            report.detail.append("the loop's drift check re-rendered its messages differently")
        first = first_drift(ids, reference, self.renderer.stop_token_ids)
        if first is not None:
            report.drifted_tokens = len(ids) - first
            report.detail.append(f"trajectory drifts from the template's render at token {first}")
        engine_tokens = [t for turn in outputs for t in turn]
        masked = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m]
        if masked != engine_tokens:
            report.mask_errors = 1
            report.detail.append("mask is not 1 exactly on the engine's tokens")
        expected = [(c.name, c.arguments) for c in conversation.calls]
        report.unparsed_calls = _missing(expected, self.executed)
        if report.unparsed_calls:
            report.detail.append(f"calls made {expected}, calls executed {self.executed}")
        return report

    async def check_gateway(self, conversation: Conversation) -> FidelityReport:
        """Drive the gateway as an OpenAI client would (each reply echoed with its
        reasoning and tool calls); check the replies and the one recorded sample."""
        from agentrl.server.gateway.protocol import ChatCompletionRequest

        report = FidelityReport()
        session, reference_messages, outputs = self._start(conversation)
        messages: list[Message] = [dict(m) for m in conversation.prompt]
        for index, turn in enumerate(conversation.turns):
            request = ChatCompletionRequest.model_validate(
                {"model": "m", "messages": messages, "tools": TOOL_SCHEMAS}
            )
            result = await self.gateway.run(await self.gateway.prepare_chat(request, session))
            choice = result.choices[0]
            got = [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in choice.tool_calls
            ]
            missing = _missing([(c.name, c.arguments) for c in turn.calls], got)
            report.unparsed_calls += missing
            if missing:
                report.detail.append(f"gateway turn {index}: calls {got}, expected {turn.calls}")
            expected_reasoning = turn.reasoning.strip() if turn.reasoning else None
            if (choice.reasoning or None) != expected_reasoning:
                report.gateway_mismatches += 1
                report.detail.append(f"gateway turn {index}: reasoning {choice.reasoning!r}")
            messages.append(
                {
                    "role": "assistant",
                    "content": choice.content,
                    "reasoning_content": choice.reasoning,
                    "tool_calls": choice.tool_calls or None,
                }
            )
            messages.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": call.result}
                for c, call in zip(choice.tool_calls, turn.calls, strict=False)
            )
        await self.gateway.store.finish(session)
        [(_, samples, _)] = self.sink.drain()
        if len(samples) != 1:
            report.gateway_mismatches += 1
            report.detail.append(f"gateway recorded {len(samples)} samples, not 1")
        sample = samples[-1]
        recorded = sample.prompt_ids + sample.response_ids
        if recorded != self.engine.calls[-1].prompt_ids + outputs[-1]:
            report.gateway_mismatches += 1
            report.detail.append("gateway sample is not what the engine saw")
        rendering = self.rendering
        if not rendering.renders_call_ids:
            reference = rendering.encode(rendering.render(reference_messages, False))
            first = first_drift(recorded, reference, self.renderer.stop_token_ids)
            if first is not None:
                report.drifted_tokens += len(recorded) - first
                report.detail.append(f"gateway sample drifts from the render at token {first}")
        masked = [t for t, m in zip(sample.response_ids, sample.response_mask, strict=True) if m]
        if len(samples) == 1 and masked != [t for turn in outputs for t in turn]:
            report.mask_errors += 1
            report.detail.append("gateway sample's mask is not 1 exactly on the engine's tokens")
        return report


# --- the real stack: a deterministic tool and an OpenAI-client agent ---------------------


def tool_result(name: str, arguments: dict[str, Any]) -> str:
    """What ``EchoArgumentsTool`` answers: the call itself, with non-ASCII and markup."""
    return f"{name} → {json.dumps(arguments, sort_keys=True, ensure_ascii=False)} <ok/>"


class EchoArgumentsTool(BaseTool):
    """A tool whose result is a function of its call (``tool_result``), so a test knows
    every result in advance; load it from YAML with one of ``TOOL_SCHEMAS``."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return ToolResponse(text=tool_result(self.name, parameters)), 0.0, {}


def scripted_row(conversation: Conversation) -> dict[str, Any]:
    """A dataset row for ``conversation``: its prompt, and in ``extra_info`` the calls and
    reasoning of each turn for ``openai_tool_agent`` to expect."""
    turns = [
        {"reasoning": t.reasoning, "calls": [[c.name, c.arguments] for c in t.calls]}
        for t in conversation.turns
    ]
    return {
        "prompt": conversation.prompt,
        "data_source": "fidelity",
        "reward_model": {"ground_truth": "", "style": "rule"},
        "extra_info": {"turns": turns},
    }


async def openai_tool_agent(row: dict[str, Any], endpoint: Any) -> float:
    """An external agent on the plain ``openai`` client: each turn it sends the history
    with ``TOOL_SCHEMAS``, checks the reply's tool calls and ``reasoning_content`` against
    the row's script, echoes the reply back and answers each call with ``tool_result``."""
    import openai

    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    messages = list(row["prompt"])
    for index, turn in enumerate(row["extra_info"]["turns"]):
        reply = await client.chat.completions.create(
            model=endpoint.model, messages=messages, tools=TOOL_SCHEMAS, max_tokens=4096
        )
        message = reply.choices[0].message
        calls = [
            [c.function.name, json.loads(c.function.arguments)] for c in message.tool_calls or []
        ]
        if calls != turn["calls"]:
            raise AssertionError(
                f"turn {index}: the gateway parsed {calls}, the model made {turn['calls']}"
            )
        reasoning = (message.model_extra or {}).get("reasoning_content")
        expected = turn["reasoning"].strip() if turn["reasoning"] else None
        if reasoning != expected:
            raise AssertionError(
                f"turn {index}: reasoning_content {reasoning!r}, expected {expected!r}"
            )
        messages.append(message.model_dump(exclude_none=True))
        messages.extend(
            {"role": "tool", "tool_call_id": c.id, "content": tool_result(name, arguments)}
            for c, (name, arguments) in zip(message.tool_calls or [], calls, strict=True)
        )
    return 1.0
