"""``GatewayService``: what the HTTP endpoints do, independent of HTTP.

Each completion call is prepared (validated, prompt ids built, reusing a session's exact
ids where the conversation continues a recorded one), then run (generated on the rollout
servers with the session id for KV-cache affinity, decoded, tool calls parsed, recorded).
Streaming endpoints prepare before the response starts, so bad input is still a 4xx.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from agentrl.core.types import RolloutError, SamplingParams, TokenOutput
from agentrl.server.client import ReplicaFailure
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.decoding import cut_at_stop, visible_text
from agentrl.server.gateway.errors import GatewayError
from agentrl.server.gateway.messages import message_key, template_message, template_tools, tools_key
from agentrl.server.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from agentrl.server.gateway.replies import ReplyParser
from agentrl.server.gateway.sessions import CallRecord, Completion, Session, SessionStore
from agentrl.server.gateway.sink import TrajectorySink
from agentrl.server.gateway.template import GatewayTemplate, TemplateError

logger = logging.getLogger(__name__)


class GenerateClient(Protocol):
    """What the gateway needs from the rollout servers (``DataClient`` implements it)."""

    async def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None = None
    ) -> TokenOutput: ...


@dataclass
class Choice:
    """One generated choice, ready for the response."""

    index: int
    output: TokenOutput
    completion_ids: list[int]
    text: str
    finish_reason: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None


@dataclass
class PreparedCall:
    """A validated call whose prompt ids are known and which has not run yet."""

    call_id: str
    model: str
    session: Session | None
    prompt_ids: list[int]
    reused_prompt_tokens: int
    sampling: SamplingParams
    n: int
    stops: list[str]
    chat: ChatCompletionRequest | None = None
    chat_key: tuple[str, str, tuple[str, ...]] | None = None
    text_prompt: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class CallResult:
    """A finished call: its prompt and choices."""

    prepared: PreparedCall
    choices: list[Choice]

    @property
    def usage(self) -> dict[str, Any]:
        prompt = len(self.prepared.prompt_ids)
        completion = sum(len(c.completion_ids) for c in self.choices)
        cached = self.choices[0].output.num_cached_tokens if self.choices else 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


def _chat_match(key: Any, wanted: tuple[str, str, tuple[str, ...]]) -> int | None:
    """How many messages of ``wanted`` a recorded chat key covers (None if not a prefix)."""
    if not (isinstance(key, tuple) and key[:2] == wanted[:2]):
        return None
    messages = key[2]
    return len(messages) if wanted[2][: len(messages)] == messages else None


def _text_match(key: Any, text: str) -> int | None:
    if isinstance(key, tuple) and key[0] == "text" and text.startswith(key[1]):
        return len(key[1])
    return None


class GatewayService:
    """Chat/text/token completions over the rollout servers, with session recording."""

    def __init__(
        self,
        client: GenerateClient,
        tokenizer: Any,
        config: GatewayConfig,
        model_name: str,
        max_model_len: int,
        sink: TrajectorySink,
        model_aliases: tuple[str, ...] = (),
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self._accepted_models = {model_name, *model_aliases}
        self.max_model_len = max_model_len
        self.sink = sink
        self.store = SessionStore(sink, config.max_sessions, config.session_ttl_s)
        self.template = (
            GatewayTemplate(tokenizer, config.tools_in_system_prompt, config.tools_prompt_template)
            if tokenizer.chat_template
            else None
        )
        self._reply = ReplyParser(tokenizer, config.tool_parser, config.reasoning_parser)

    # ----------------------------------------------------------------- preparation
    def check_model(self, name: str | None) -> str:
        if name is not None and name not in self._accepted_models:
            raise GatewayError(
                404,
                f"model {name!r} is not served here; use {self.model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        return self.model_name

    def _max_tokens(
        self, prompt_len: int, limit: int | None, prompt_param: str, limit_param: str
    ) -> int:
        """The completion length: ``limit`` if it fits the context window after the
        prompt (400 otherwise, as OpenAI answers), else the default capped to fit."""
        room = self.max_model_len - prompt_len
        if room <= 0:
            raise GatewayError(
                400,
                f"the prompt has {prompt_len} tokens but the context window is "
                f"{self.max_model_len}; shorten the conversation",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if limit is None:
            return min(self.config.default_max_tokens, room)
        if limit > room:
            raise GatewayError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {prompt_len + limit} tokens ({prompt_len} in the "
                f"messages, {limit} in the completion). Please reduce the length of the "
                f"messages or completion ({limit_param} <= {room} here).",
                param=limit_param,
                code="context_length_exceeded",
            )
        return limit

    def _sampling(
        self, fields: Any, prompt_len: int, limit: int | None, limit_param: str
    ) -> SamplingParams:
        max_tokens = self._max_tokens(prompt_len, limit, "messages", limit_param)
        if fields.n > self.config.max_n:
            raise GatewayError(400, f"n must be <= {self.config.max_n}, got {fields.n}", param="n")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if fields.temperature is None else fields.temperature,
            top_p=1.0 if fields.top_p is None else fields.top_p,
            top_k=-1 if fields.top_k is None else fields.top_k,
            seed=fields.seed,
        )

    async def _open(self, session_id: str | None, group_id: str | None) -> Session | None:
        if group_id is not None and session_id is None:
            raise GatewayError(400, "x-group-id needs a session (x-session-id or /sessions/{id})")
        return await self.store.open(session_id, group_id) if session_id else None

    async def prepare_chat(
        self, request: ChatCompletionRequest, session_id: str | None, group_id: str | None = None
    ) -> PreparedCall:
        """Validate a chat request and build its prompt ids."""
        model = self.check_model(request.model)
        if self.template is None:
            raise GatewayError(400, "this model has no chat template; use /v1/completions")
        session = await self._open(session_id, group_id)
        messages = [template_message(m) for m in request.messages]
        tools = template_tools(request.tools)
        wanted = ("chat", tools_key(request.tools), tuple(message_key(m) for m in messages))
        parent = session.find_by_key(lambda key: _chat_match(key, wanted)) if session else None
        try:
            prompt_ids, reused = await asyncio.to_thread(
                self._chat_prompt_ids, parent, messages, tools
            )
        except TemplateError as exc:
            raise GatewayError(400, str(exc), param="messages") from exc
        return PreparedCall(
            call_id=f"chatcmpl-{uuid.uuid4().hex}",
            model=model,
            session=session,
            prompt_ids=prompt_ids,
            reused_prompt_tokens=reused,
            sampling=self._sampling(
                request,
                len(prompt_ids),
                request.completion_limit(),
                "max_completion_tokens" if request.max_completion_tokens else "max_tokens",
            ),
            n=request.n,
            stops=request.stop_strings(),
            chat=request,
            chat_key=wanted,
        )

    def _chat_prompt_ids(
        self,
        parent: CallRecord | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> tuple[list[int], int]:
        """Prompt ids, reusing ``parent``'s exact ids when it is given."""
        assert self.template is not None
        if parent is not None:
            covered = len(parent.key[2])
            try:
                delta = self.template.delta_ids(messages[covered:], tools, parent.last_token)
                return parent.full_ids + delta, len(parent.full_ids)
            except TemplateError as exc:
                logger.info("no template delta (%s); rendering the whole conversation", exc)
        return self.template.prompt_ids(messages, tools), 0

    async def prepare_completion(
        self, request: CompletionRequest, session_id: str | None, group_id: str | None = None
    ) -> PreparedCall:
        """Validate a text-completion request and build its prompt ids."""
        model = self.check_model(request.model)
        session = await self._open(session_id, group_id)
        reused = 0
        text_prompt = request.prompt if isinstance(request.prompt, str) else None
        if text_prompt is None:
            prompt_ids = list(request.prompt)  # token ids
        else:
            parent = (
                session.find_by_key(lambda key: _text_match(key, text_prompt)) if session else None
            )
            if parent is None:
                prompt_ids = await asyncio.to_thread(self._encode, text_prompt)
            else:
                suffix = text_prompt[len(parent.key[1]) :]
                prompt_ids = parent.full_ids + await asyncio.to_thread(self._encode, suffix)
                reused = len(parent.full_ids)
        return PreparedCall(
            call_id=f"cmpl-{uuid.uuid4().hex}",
            model=model,
            session=session,
            prompt_ids=prompt_ids,
            reused_prompt_tokens=reused,
            sampling=self._sampling(request, len(prompt_ids), request.max_tokens, "max_tokens"),
            n=request.n,
            stops=request.stop_strings(),
            text_prompt=text_prompt,
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ----------------------------------------------------------------- running
    async def run(self, prepared: PreparedCall) -> CallResult:
        """Generate the prepared call's choices, decode them, and record them."""
        outputs = await self._generate(prepared)
        choices = [self._choice(i, out, prepared) for i, out in enumerate(outputs)]
        self._record(prepared, choices)
        return CallResult(prepared, choices)

    async def generate_tokens(
        self, request: GenerateRequest, session_id: str | None, group_id: str | None = None
    ) -> tuple[str, TokenOutput]:
        """``/v1/generate``: one token-level call (recorded, linked by ids alone)."""
        self.check_model(request.model)
        prompt_ids = list(request.prompt_ids)
        sampling = SamplingParams(
            max_tokens=self._max_tokens(
                len(prompt_ids), request.max_tokens, "prompt_ids", "max_tokens"
            ),
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            stop_token_ids=list(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
        )
        session = await self._open(session_id, group_id)
        prepared = PreparedCall(
            call_id=f"gen-{uuid.uuid4().hex}",
            model=self.model_name,
            session=session,
            prompt_ids=prompt_ids,
            reused_prompt_tokens=0,
            sampling=sampling,
            n=1,
            stops=[],
        )
        result = await self.run(prepared)
        return prepared.call_id, result.choices[0].output

    async def _generate(self, prepared: PreparedCall) -> list[TokenOutput]:
        session_id = prepared.session.session_id if prepared.session else None
        try:
            prepared.sampling.validate()
        except RolloutError as exc:
            raise GatewayError(400, str(exc)) from exc
        tasks = [
            asyncio.ensure_future(
                self.client.generate(session_id, prepared.prompt_ids, replace(prepared.sampling))
            )
            for _ in range(prepared.n)
        ]
        try:
            return await asyncio.wait_for(
                asyncio.gather(*tasks), timeout=self.config.request_timeout_s
            )
        except RolloutError as exc:
            raise GatewayError(400, str(exc)) from exc
        except TimeoutError as exc:
            raise GatewayError(
                504, f"generation took longer than {self.config.request_timeout_s:g} s"
            ) from exc
        except (ReplicaFailure, BackPressureError, RayActorError) as exc:
            raise GatewayError(503, f"rollout servers unavailable: {exc}") from exc
        finally:
            for task in tasks:
                task.cancel()

    def _choice(self, index: int, out: TokenOutput, prepared: PreparedCall) -> Choice:
        ids, finish = list(out.token_ids), out.finish_reason
        cut = cut_at_stop(self.tokenizer, ids, prepared.stops) if prepared.stops else None
        if cut is not None:
            (ids, text), finish = cut, "stop"
        else:
            text = visible_text(self.tokenizer, ids)
        choice = Choice(index, out, ids, text, finish, content=text)
        request = prepared.chat
        if request is None:
            return choice
        parse_calls = bool(request.tools) and request.tool_choice != "none"
        reply = self._reply.parse(ids, template_tools(request.tools), parse_calls)
        if reply is None:
            return choice
        choice.reasoning = reply.reasoning
        if reply.content is not None:
            choice.content = reply.content
        if reply.malformed_calls and prepared.session is not None:
            prepared.session.counters["malformed_tool_calls"] += reply.malformed_calls
        if reply.calls:
            choice.content = reply.content or None
            choice.finish_reason = "tool_calls"
            choice.tool_calls = [
                {
                    # The model's own id when it wrote one (Kimi K2's): the client echoes
                    # it back, and the template must render the call as it was sampled.
                    "id": call.id or f"call_{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(call.arguments, ensure_ascii=False),
                    },
                }
                for call in reply.calls
            ]
        return choice

    def _record(self, prepared: PreparedCall, choices: list[Choice]) -> None:
        session = prepared.session
        if session is None:
            return
        if session.finished:
            logger.warning(
                "session %s finished while call %s ran; the call is not recorded",
                session.session_id,
                prepared.call_id,
            )
            return
        session.add_call(
            prepared.call_id,
            prepared.prompt_ids,
            [
                Completion(c.output, c.completion_ids, c.finish_reason, self._key(prepared, c))
                for c in choices
            ],
            now=time.monotonic(),
        )
        session.counters["reused_prompt_tokens"] += prepared.reused_prompt_tokens

    @staticmethod
    def _key(prepared: PreparedCall, choice: Choice) -> tuple[Any, ...] | None:
        """What a later request repeats to continue from ``choice``."""
        if prepared.chat_key is not None:
            reply = {
                "role": "assistant",
                "content": choice.content or "",
                "reasoning_content": choice.reasoning,
                "tool_calls": [
                    {
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": json.loads(c["function"]["arguments"]),
                        }
                    }
                    for c in choice.tool_calls
                ],
            }
            kind, tools, messages = prepared.chat_key
            return (kind, tools, (*messages, message_key(reply)))
        if prepared.text_prompt is not None:
            return ("text", prepared.text_prompt + choice.text)
        return None
