"""LLM-as-judge rewards: a model scores responses from a rubric prompt (``reward.judge``).

    judge = RewardJudge(config, client, tokenizer)  # client: generate(session, ids, sampling)
    verdicts = await judge.judge(requests)          # one Verdict per RewardRequest, in order
    verdicts[0].score, verdicts[0].error, verdicts[0].cached

``pointwise`` fills the rubric with one request's ``{prompt}``, ``{response}`` and
``{ground_truth}`` and reads what follows the judge's last ``<score>``: a number from 0
to ``max_score`` (divided by it) or yes/no (1/0). The answer may start with ``prefill``
(``<score>``: a small judge then writes its verdict first). ``group`` (RULER-style) puts
the distinct responses of one prompt in one rubric as ``{responses}`` (numbered from 1) and reads
``<score_1>``, ``<score_2>``, ... in the same answer, one per response; the requests of a
batch that share their prompt and ground truth form a group.

A verdict that cannot be read, a judge call past ``timeout_s`` and a call that fails are
``Verdict``s with an ``error`` (``timed_out`` for the timeout), never exceptions; a
failure to start the judge's servers is raised. Verdicts are cached by the judge's whole
input, so an identical (prompt, response) is judged once, also when both arrive at the same
time; failed verdicts are not cached.

``RewardJudge.from_config`` serves the judge model on rollout replicas of its own
(``ServedJudge``: a Serve application started on first use, that no weight push reaches).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agentrl.core.config import ModelConfig
from agentrl.core.types import SamplingParams, TokenOutput
from agentrl.reward.config import JudgeConfig, judge_server, rubric_problems
from agentrl.server.config import ServerConfig

if TYPE_CHECKING:
    from agentrl.reward.manager import RewardRequest

__all__ = [
    "JudgeClient",
    "RewardJudge",
    "ServedJudge",
    "Verdict",
    "default_rubric",
    "parse_group_verdict",
    "parse_verdict",
    "render_prompt",
]

logger = logging.getLogger(__name__)

_OUTPUT_CHARS = 2000
"""Characters of the judge's answer kept on a failed verdict (for the records)."""


class JudgeClient(Protocol):
    """What the judge generates through: a rollout ``DataClient``, or ``ScriptedClient``
    in tests."""

    def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None
    ) -> Awaitable[TokenOutput]: ...


@dataclass(frozen=True)
class Verdict:
    """The judge's score of one response in [0, 1], or why there is none."""

    score: float | None
    error: str | None = None
    timed_out: bool = False
    cached: bool = False
    """Judged before (or at the same time, for an identical request): no call of its own."""
    output: str = ""
    """The judge's answer (on a failure: its first characters)."""


def _format_number(value: float) -> str:
    return f"{value:g}"


def default_rubric(
    mode: Literal["pointwise", "group"], verdict: Literal["number", "yes_no"], tag: str
) -> str:
    """The built-in rubric of judge ``mode`` and ``verdict`` whose answer uses ``tag``."""
    if verdict == "number":
        scale = "from 0 (wrong or useless) to {max_score} (fully correct and clear)"
        value = "N"
    else:
        scale = "yes if it is correct, no if it is not"
        value = "yes or no"
    if mode == "pointwise":
        return (
            "Grade the response to the task below.\n\n"
            "Task:\n{prompt}\n\n"
            "Reference answer: {ground_truth}\n\n"
            "Response:\n{response}\n\n"
            f"Judge the response: {scale}. Reason in one or two sentences, then write "
            f"your verdict as <{tag}>{value}</{tag}>."
        )
    return (
        "Compare {count} responses to the task below.\n\n"
        "Task:\n{prompt}\n\n"
        "Reference answer: {ground_truth}\n\n"
        "{responses}\n\n"
        f"Judge each response relative to the others: {scale}. Reason briefly, then write "
        f"one verdict per response: <{tag}_1>{value}</{tag}_1> for response 1, "
        f"<{tag}_2>{value}</{tag}_2> for response 2, and so on."
    )


def render_prompt(prompt: Any) -> str:
    """The task as the judge reads it: a chat's one message's content, the messages as
    ``role: content`` paragraphs, or a string as it is."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    messages = [m for m in prompt if isinstance(m, Mapping)]
    if len(messages) == 1:
        return str(messages[0].get("content", ""))
    return "\n\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)


def _render_ground_truth(ground_truth: Any) -> str:
    return "(none given)" if ground_truth is None else str(ground_truth)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each known ``{name}`` replaced; other braces stay as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


_NUMBER = re.compile(r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+))(?:\s*/\s*\d+(?:\.\d*)?)?$")
_YES = {"yes", "true", "correct", "1"}
_NO = {"no", "false", "incorrect", "0"}


def _value(
    content: str, where: str, verdict: Literal["number", "yes_no"], max_score: float
) -> float:
    """The normalised score in a tag's ``content``; ``ValueError`` saying what is wrong."""
    text = content.strip().strip(".!*").strip()
    if verdict == "yes_no":
        word = text.lower()
        if word in _YES or word in _NO:
            return 1.0 if word in _YES else 0.0
        raise ValueError(f"{where} holds {content!r}, not yes or no")
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"{where} holds {content!r}, not a number")
    number = float(match.group(1))
    if not 0 <= number <= max_score:
        raise ValueError(f"{where} holds {number:g}, outside 0..{_format_number(max_score)}")
    return number / max_score


def _last_tag(text: str, tag: str) -> str | None:
    """The first line of what follows the last ``<tag>`` up to the next ``<`` (its closing
    tag, or none: a verdict holds no ``<``); None without a ``<tag>``."""
    opened = [m.end() for m in re.finditer(f"<{re.escape(tag)}>", text, re.I)]
    if not opened:
        return None
    content = text[opened[-1] :].split("<", 1)[0].strip()
    return content.splitlines()[0] if content else ""


def parse_verdict(
    text: str, tag: str, verdict: Literal["number", "yes_no"], max_score: float
) -> float:
    """The score in [0, 1] of a pointwise answer: its last ``<tag>...</tag>``.

    Raises ``ValueError`` naming what is missing or wrong."""
    content = _last_tag(text, tag)
    if content is None:
        raise ValueError(f"no <{tag}> in the judge's answer")
    return _value(content, f"<{tag}>", verdict, max_score)


def parse_group_verdict(
    text: str, tag: str, verdict: Literal["number", "yes_no"], max_score: float, count: int
) -> list[float | str]:
    """The score in [0, 1] of each of ``count`` responses (``<tag_1>`` ... ``<tag_N>``),
    or, where it cannot be read, what is wrong."""
    scores: list[float | str] = []
    for k in range(1, count + 1):
        content = _last_tag(text, f"{tag}_{k}")
        if content is None:
            scores.append(f"no <{tag}_{k}> in the judge's answer")
            continue
        try:
            scores.append(_value(content, f"<{tag}_{k}>", verdict, max_score))
        except ValueError as exc:
            scores.append(str(exc))
    return scores


def load_rubric(config: JudgeConfig) -> str:
    """The rubric template of ``config``: ``rubric``, the file ``rubric_path``, or the
    built-in one. Raises ``ConfigError`` for a file that is missing or does not fit."""
    from agentrl.config import ConfigError

    if config.rubric is not None:
        return config.rubric
    if config.rubric_path is None:
        return default_rubric(config.mode, config.verdict, config.tag)
    path = Path(config.rubric_path)
    if not path.is_file():
        raise ConfigError(f"reward.judge.rubric_path: {path} is not a file (cwd: {Path.cwd()})")
    rubric = path.read_text()
    problems = rubric_problems(rubric, config.mode)
    if problems:
        raise ConfigError(f"reward.judge.rubric_path: {path}: {'; '.join(problems)}")
    return rubric


@dataclass(frozen=True)
class _Answer:
    """One judge call's outcome: a score (or what is wrong) per response it judged."""

    scores: list[float | str]
    output: str = ""
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        return all(isinstance(score, float) for score in self.scores)


class RewardJudge:
    """Judges responses with a model behind ``client``, from ``rubric`` (None: the file
    or built-in rubric ``config`` names).

    ``server``: the judge's own servers, started before the first call (``ServedJudge``).
    At most ``config.max_concurrency`` calls run at once; each has ``config.timeout_s``.
    """

    def __init__(
        self,
        config: JudgeConfig,
        client: JudgeClient,
        tokenizer: Any,
        *,
        rubric: str | None = None,
        server: ServedJudge | None = None,
    ) -> None:
        self.config = config
        self.rubric = load_rubric(config) if rubric is None else rubric
        problems = rubric_problems(self.rubric, config.mode)
        if problems:
            raise ValueError(f"rubric: {'; '.join(problems)}")
        self._client = client
        self._tokenizer = tokenizer
        self._server = server
        eos = getattr(tokenizer, "eos_token_id", None)
        self._sampling = SamplingParams(
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            stop_token_ids=[eos] if isinstance(eos, int) else [],
        )
        self._prefill_ids: list[int] = (
            tokenizer.encode(config.prefill, add_special_tokens=False) if config.prefill else []
        )
        self._cache: OrderedDict[str, _Answer] = OrderedDict()
        self._pending: dict[str, asyncio.Task[_Answer]] = {}
        self._slots: asyncio.Semaphore | None = None
        self.calls = 0
        """Judge calls made (cache hits make none)."""

    @classmethod
    def from_config(
        cls, config: JudgeConfig, model: ModelConfig, server: ServerConfig
    ) -> RewardJudge:
        """A judge on servers of its own: ``config.model_path`` (None: the policy's
        ``model``, its initial weights) on the policy's ``server`` section changed by
        ``config.server``. The servers start at the first call."""
        from transformers import AutoTokenizer

        from agentrl.config import ConfigError
        from agentrl.models import resolve_model_config

        if config.model_path is not None:
            model = model.model_copy(update={"path": config.model_path, "tokenizer_path": None})
        if not model.path:
            raise ConfigError(
                "reward.judge.model_path is required when the policy's model.path is empty"
            )
        try:
            served_config = judge_server(server, config.server)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        model = resolve_model_config(model)
        tokenizer = AutoTokenizer.from_pretrained(
            model.tokenizer, trust_remote_code=model.trust_remote_code
        )
        served = ServedJudge(model, served_config)
        return cls(config, served, tokenizer, server=served)

    async def judge(self, requests: Sequence[RewardRequest]) -> list[Verdict]:
        """A verdict per request, in order (see the module docstring)."""
        if self._server is not None:
            await self._server.start()
        if self.config.mode == "pointwise":
            return list(await asyncio.gather(*(self._pointwise(r) for r in requests)))
        groups: dict[tuple[str, str], list[int]] = {}
        for index, request in enumerate(requests):
            key = (render_prompt(request.prompt), _render_ground_truth(request.ground_truth))
            groups.setdefault(key, []).append(index)
        verdicts: list[Verdict | None] = [None] * len(requests)
        judged = await asyncio.gather(
            *(self._group([requests[i] for i in members]) for members in groups.values())
        )
        for members, group_verdicts in zip(groups.values(), judged, strict=True):
            for index, verdict in zip(members, group_verdicts, strict=True):
                verdicts[index] = verdict
        return [v for v in verdicts if v is not None]

    def _values(self, request: RewardRequest) -> dict[str, str]:
        return {
            "prompt": render_prompt(request.prompt),
            "ground_truth": _render_ground_truth(request.ground_truth),
            "max_score": _format_number(self.config.max_score),
        }

    async def _pointwise(self, request: RewardRequest) -> Verdict:
        text = _fill(self.rubric, {**self._values(request), "response": request.solution_str})
        answer, cached = await self._answer(text, self._parse_one, 1)
        return _verdict(answer, 0, cached)

    async def _group(self, requests: list[RewardRequest]) -> list[Verdict]:
        distinct = list(dict.fromkeys(r.solution_str for r in requests))
        listed = "\n\n".join(f"Response {k}:\n{text}" for k, text in enumerate(distinct, 1))
        values = {**self._values(requests[0]), "responses": listed, "count": str(len(distinct))}
        count = len(distinct)
        answer, cached = await self._answer(
            _fill(self.rubric, values), lambda output: self._parse_group(output, count), count
        )
        position = {text: k for k, text in enumerate(distinct)}
        return [_verdict(answer, position[r.solution_str], cached) for r in requests]

    def _parse_one(self, output: str) -> list[float | str]:
        config = self.config
        try:
            return [parse_verdict(output, config.tag, config.verdict, config.max_score)]
        except ValueError as exc:
            return [str(exc)]

    def _parse_group(self, output: str, count: int) -> list[float | str]:
        config = self.config
        return parse_group_verdict(output, config.tag, config.verdict, config.max_score, count)

    async def _answer(
        self, text: str, parse: Callable[[str], list[float | str]], count: int
    ) -> tuple[_Answer, bool]:
        """The answer to judge input ``text`` (``count`` responses): cached, shared with an
        identical call in flight, or asked now; and whether it was not asked for this call."""
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached, True
        task = self._pending.get(text)
        if task is not None:
            return await asyncio.shield(task), True
        task = asyncio.ensure_future(self._ask(text, parse, count))
        self._pending[text] = task
        task.add_done_callback(lambda _: self._pending.pop(text, None))
        return await asyncio.shield(task), False

    async def _ask(
        self, text: str, parse: Callable[[str], list[float | str]], count: int
    ) -> _Answer:
        """One judge call; a failure is an answer whose scores say what went wrong."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.max_concurrency)
        timeout_s = self.config.timeout_s
        async with self._slots:
            self.calls += 1
            try:
                prompt_ids = self._tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
                prompt_ids = [*prompt_ids, *self._prefill_ids]
                async with asyncio.timeout(timeout_s):
                    out = await self._client.generate(None, prompt_ids, self._sampling)
            except TimeoutError:
                logger.warning("judge call timed out after %.1fs", timeout_s)
                return _Answer([f"judge timed out after {timeout_s:g}s"] * count, timed_out=True)
            except Exception as exc:
                logger.warning("judge call failed: %s: %s", type(exc).__name__, exc)
                return _Answer([f"judge call failed: {type(exc).__name__}: {exc}"] * count)
        output = self.config.prefill + self._tokenizer.decode(
            out.token_ids, skip_special_tokens=True
        )
        answer = _Answer(parse(output), output)
        if not answer.complete:
            logger.warning("judge answer not understood: %s", output[:200])
        elif self.config.cache_size:
            self._cache[text] = answer
            if len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return answer

    def close(self) -> None:
        """Stop the judge's servers, if this judge started them."""
        if self._server is not None:
            self._server.close()


def _verdict(answer: _Answer, index: int, cached: bool) -> Verdict:
    score = answer.scores[index]
    if isinstance(score, float):
        return Verdict(score, cached=cached, output=answer.output)
    return Verdict(
        None, error=score, timed_out=answer.timed_out, output=answer.output[:_OUTPUT_CHARS]
    )


class ServedJudge:
    """The judge model on rollout replicas of its own: a Serve application deployed by
    ``start`` (in a worker thread) and deleted by ``close``. It is never handed to a
    weight sync, so it keeps the weights it started with."""

    def __init__(self, model: ModelConfig, server: ServerConfig) -> None:
        self.model = model
        # The plain DeploymentHandle: its calls are bound to no event loop, so nothing has
        # to be closed on the loop the rewards ran on.
        self.server = server.model_copy(update={"serve_public_path": True})
        self._client: Any = None
        self._deployed = False  # also when the deployment failed half-way: close deletes it
        self._starting: asyncio.Lock | None = None

    async def start(self) -> None:
        """Deploy the judge's replicas unless they run, in a worker thread (the event loop
        goes on meanwhile); a failure to start is raised."""
        if self._client is not None:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._client is None:
                await asyncio.to_thread(self._deploy)

    def _deploy(self) -> None:
        from agentrl.server.launch import start_rollout_servers

        self._deployed = True
        logger.info(
            "starting the judge: %d replica(s) of %s as Serve application %r",
            self.server.num_replicas,
            self.model.path,
            self.server.name,
        )
        self._client = start_rollout_servers(self.model, self.server).data

    async def generate(
        self, session_id: str | None, prompt_ids: list[int], sampling: SamplingParams | None
    ) -> TokenOutput:
        """Generate on the judge's replicas (``start`` first)."""
        if self._client is None:
            raise RuntimeError("the judge's servers are not started: await start() first")
        return await self._client.generate(session_id, prompt_ids, sampling)

    def close(self) -> None:
        """Delete the judge's Serve application (nothing to do if it never started or
        Ray is down already)."""
        if not self._deployed:
            return
        self._client, self._deployed = None, False
        import ray

        if not ray.is_initialized():
            return
        from agentrl.server.launch import stop_rollout_servers

        try:
            stop_rollout_servers(self.server)
        except Exception as exc:  # the run is ending; its other parts must still stop
            logger.warning("stopping the judge's servers: %s", exc)
