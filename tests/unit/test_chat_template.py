"""``agentrl.chat_template``: the shape cache must give exactly what the template renders."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.chat_template import ChatTemplate, TemplateError, text_decoder, text_encoder
from agentrl.testing.tools import ADD_TOOL_SCHEMA

TOOLS = [ADD_TOOL_SCHEMA]

CONTENTS = [
    "plain",
    "",
    "  leading and trailing  \n",
    "quotes \"x\" 'y' and {{ braces }} {% tags %} <b>markup</b> & é ✓",
    "@@agentrl-slot-0@@ looks like a placeholder",
    "multi\nline\n\ncontent",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def _with_template(tokenizer, template: str):
    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("content", CONTENTS)
def test_cached_renders_equal_full_renders(tokenizer, tools, content):
    template = ChatTemplate(tokenizer, tools)
    shapes = [
        [{"role": "user", "content": content}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": content}],
    ]
    for messages in shapes:
        for gen in (True, False):
            first = template.render(messages, gen)  # builds the cache entry
            assert first == template.render_full(messages, gen)
            assert template.cached_render(messages, gen) == first
    new = [{"role": "tool", "content": content}, {"role": "tool", "content": content + "!"}]
    assert template.delta_text(new) == ChatTemplate(tokenizer, tools, fast_path=False).delta_text(
        new
    )
    assert template.cached_delta_text(new) == template.delta_text(new)


def test_delta_drops_the_end_of_turn_text_already_generated(tokenizer):
    template = ChatTemplate(tokenizer, TOOLS)
    new = [{"role": "tool", "content": "3"}]
    full = template.delta_text(new)
    eos = tokenizer.eos_token
    assert full.startswith(eos)
    assert template.delta_text(new, drop_prefix=eos) == full[len(eos) :]
    assert template.cached_delta_text(new, drop_prefix=eos) == full[len(eos) :]
    assert template.delta_text(new, drop_prefix="not a prefix") == full


def test_nothing_is_cached_before_a_shape_is_first_rendered(tokenizer):
    template = ChatTemplate(tokenizer, TOOLS)
    messages = [{"role": "user", "content": "hi"}]
    assert template.cached_render(messages, True) is None
    assert template.cached_delta_text([{"role": "tool", "content": "x"}]) is None
    template.render(messages, True)
    assert template.cached_render([{"role": "user", "content": "other"}], True) is not None
    # A different shape (extra field) is a different cache entry.
    assert template.cached_render([{"role": "user", "content": "o", "name": "n"}], True) is None


@pytest.mark.parametrize(
    "body",
    [
        "{{ m.content | trim }}",  # changes whitespace
        "{{ m.content | e }}",  # escapes markup
        "{{ m.content }}{{ m.content }}",  # repeats content
        "{{ m.content[:3] }}",  # truncates content
    ],
)
def test_templates_that_transform_content_are_rendered_in_full(tokenizer, body):
    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n" + body + "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    template = ChatTemplate(_with_template(tokenizer, source))
    for content in CONTENTS:
        messages = [{"role": "user", "content": content}]
        assert template.render(messages, True) == template.render_full(messages, True)
        assert template.cached_render(messages, True) is None
        new = [{"role": "tool", "content": content}]
        assert template.delta_text(new) == ChatTemplate(
            template.tokenizer, fast_path=False
        ).delta_text(new)


def test_non_string_content_and_disabled_fast_path_render_in_full(tokenizer):
    template = ChatTemplate(tokenizer)
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert template.render(parts, True) == template.render_full(parts, True)
    assert template.cached_render(parts, True) is None
    off = ChatTemplate(tokenizer, fast_path=False)
    messages = [{"role": "user", "content": "hi"}]
    assert off.render(messages, True) == template.render_full(messages, True)
    assert off.cached_render(messages, True) is None


def test_templates_without_append_only_deltas_raise(tokenizer):
    # Re-renders the previous assistant turn differently once a new message follows it.
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[old]"
        "{% else %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    template = ChatTemplate(_with_template(tokenizer, source))
    with pytest.raises(TemplateError, match="append-only"):
        template.delta_text([{"role": "tool", "content": "x"}])


def test_text_encoder_matches_the_tokenizer(tokenizer):
    encode = text_encoder(tokenizer)
    texts = [*CONTENTS, tokenizer.eos_token + "\n<|im_start|>user\n", "<tool_call>{}</tool_call>"]
    for text in texts:
        assert encode(text) == tokenizer.encode(text, add_special_tokens=False)


def test_text_encoder_falls_back_when_the_backend_disagrees(tokenizer):
    class Shouting:
        """A tokenizer whose Python layer changes the text before the Rust backend."""

        _tokenizer = tokenizer._tokenizer
        all_special_tokens = tokenizer.all_special_tokens

        def encode(self, text, add_special_tokens=False):
            return tokenizer.encode(text.upper(), add_special_tokens=add_special_tokens)

    encode = text_encoder(Shouting())
    assert encode("abc") == tokenizer.encode("ABC", add_special_tokens=False)


def test_text_decoder_matches_the_tokenizer(tokenizer):
    decode = text_decoder(tokenizer)
    texts = [*CONTENTS, tokenizer.eos_token + "\n<|im_start|>user\n", "a , b . c ! ?"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert decode(ids) == tokenizer.decode(ids)
    assert tokenizer.eos_token in decode([tokenizer.eos_token_id])


def test_text_decoder_falls_back_when_the_backend_disagrees(tokenizer):
    class CleaningUp:
        """A tokenizer whose Python layer rewrites the backend's text (" ," -> ",")."""

        _tokenizer = tokenizer._tokenizer
        all_special_tokens = tokenizer.all_special_tokens

        def decode(self, ids):
            return tokenizer.decode(ids).replace(" ,", ",").replace(" .", ".")

    ids = tokenizer.encode("x , y .", add_special_tokens=False)
    assert text_decoder(CleaningUp())(ids) == "x, y."
