"""Build a tiny random Qwen2-style checkpoint and a byte-level BPE tokenizer, offline, in seconds.

The tokenizer uses Qwen2's pre-tokenizer (regex split + byte-level), a ChatML chat template
with Hermes-style tool calls, and the ``<tool_call>``/``</tool_call>`` tokens, so the
checkpoint behaves like a real chat model for every code path except the quality of its text.

    from agentrl.models.tiny import build_tiny_checkpoint
    path = build_tiny_checkpoint("/tmp/tiny")   # cached: a second call is instant

``model.path: builtin:tiny-qwen2`` builds it once under the cache (``agentrl.models``).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Tags that must survive decoding (they are part of the model's visible text).
TEXT_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# HF renders chat templates with trim_blocks (a newline right after a block tag is
# dropped), so newlines that follow a tag are written as {{ '\n' }}.
CHATML_TOOL_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message.role }}{{ '\\n' }}"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}"
    "{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ fn.name }}", "arguments": '
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}"
    "\n</tool_call>"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _training_corpus(seed: int, num_lines: int = 3000) -> list[str]:
    """Local text resembling what tests send: chat, arithmetic, JSON tool calls, code."""
    rng = random.Random(seed)
    words = (
        "the a of to and in is it you that he was for on are with as his they be at one have "
        "this from or had by word but what some we can out other were all there when up use "
        "your how said an each she which do their time if will way about many then them write "
        "would like so these her long make thing see him two has look more day could go come "
        "number sound no most people my over know water than call first who may down side been "
        "now find answer question compute add sum total result tool function python code print "
        "assistant user system calculator weather search value error message"
    ).split()
    lines = []
    for _ in range(num_lines):
        kind = rng.randrange(5)
        if kind == 0:
            lines.append(" ".join(rng.choices(words, k=rng.randint(4, 16))).capitalize() + ".")
        elif kind == 1:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            lines.append(f"What is {a} + {b}? The answer is {a + b}.")
        elif kind == 2:
            args = {"expression": f"{rng.randint(1, 99)} * {rng.randint(1, 99)}"}
            lines.append(json.dumps({"name": "calculator", "arguments": args}))
        elif kind == 3:
            lines.append(f"print(sum(range({rng.randint(1, 50)})))\nx = {rng.random():.3f}")
        else:
            lines.append("\n".join(rng.choices(words, k=3)) + "\n\n")
    return lines


def build_tokenizer(out_dir: str | Path, vocab_size: int = 1024, seed: int = 0):
    """Train a byte-level BPE tokenizer and save it (with ChatML template) to ``out_dir``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(seed), trainer=trainer)

    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[],
        clean_up_tokenization_spaces=False,
    )
    hf_tokenizer.add_tokens(TEXT_TAGS, special_tokens=False)
    hf_tokenizer.chat_template = CHATML_TOOL_TEMPLATE
    hf_tokenizer.save_pretrained(str(out_dir))
    return hf_tokenizer


def build_tiny_checkpoint(
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write a random Qwen2-style model + tokenizer as a normal HF checkpoint; return its path.

    ``tie_word_embeddings``: the output projection is the embedding matrix (as in
    SmolLM2). Reuses ``out_dir`` if it already holds a complete checkpoint (``.complete``
    marker). The checkpoint is written in a temporary sibling directory and renamed into
    place, so processes that build the same one at once (``pytest -n`` workers) never
    read or write each other's half-written files.
    """
    out = Path(out_dir)
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        staging.chmod(0o755)
        params = _write_tiny_checkpoint(
            staging,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            vocab_size=vocab_size,
            max_position_embeddings=max_position_embeddings,
            seed=seed,
            tie_word_embeddings=tie_word_embeddings,
        )
        (staging / ".complete").write_text("ok")
        if out.exists() and not (out / ".complete").exists():
            shutil.rmtree(out)  # left by a build that died half-way
        try:
            staging.rename(out)
        except OSError:  # another process renamed its build into place first
            if not (out / ".complete").exists():
                raise
        else:
            logger.info("built tiny checkpoint at %s (%d params)", out, params)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write_tiny_checkpoint(
    out: Path,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
    max_position_embeddings: int,
    seed: int,
    tie_word_embeddings: bool,
) -> int:
    """``build_tiny_checkpoint``'s files, written to ``out``; returns the parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    build_tokenizer(out, vocab_size=vocab_size, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(str(out))

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # A larger init than the default makes the random model's distributions peaked enough
    # that greedy decoding is stable and weight perturbations visibly change outputs.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    model.save_pretrained(str(out), safe_serialization=True)
    model.generation_config.save_pretrained(str(out))
    return model.num_parameters()
