"""The offline tiny checkpoint behaves like a real chat model checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

SAMPLES = [
    "Hello world! What is 12 + 345?",
    '<tool_call>\n{"name": "calculator", "arguments": {"x": 1}}\n</tool_call>',
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "unicode: café, 東京, 🙂",
]


def test_autotokenizer_reloads_with_identical_ids(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    raw = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    for text in SAMPLES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text


def test_tool_call_tags_are_single_tokens(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    for tag in ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1


def test_chatml_template_renders_tools_and_tool_responses(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tool = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {}}}],
        },
        {"role": "tool", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert json.dumps(tool) in text
    assert '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_checkpoint_is_a_small_qwen2(tiny_checkpoint):
    config = AutoConfig.from_pretrained(tiny_checkpoint)
    assert config.model_type == "qwen2"
    assert config.num_hidden_layers == 2
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(tiny_checkpoint))


def test_processes_building_the_same_checkpoint_at_once_each_get_it_whole(tmp_path):
    """Two processes build one checkpoint directory at the same moment (as ``pytest -n``
    workers do): each returns a complete checkpoint, and no staging directory is left."""
    target = tmp_path / "tiny"
    script = (
        "import sys; from agentrl.models.tiny import build_tiny_checkpoint; "
        "print(build_tiny_checkpoint(sys.argv[1], hidden_size=32, vocab_size=512))"
    )
    builders = [
        subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [builder.communicate(timeout=300)[0].decode().strip() for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0]
    assert outputs == [str(target)] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]
    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.config.hidden_size == 32
    assert AutoTokenizer.from_pretrained(target)("<tool_call>")["input_ids"]
