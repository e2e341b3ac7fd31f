"""``packed_sdpa`` on the tiny model: packed rows attend like separate sequences."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.trainer.micro_batch import pack_rows
from agentrl.trainer.packed_attention import PACKED_SDPA, register_packed_sdpa


@pytest.fixture(scope="module")
def models(tiny_checkpoint):
    register_packed_sdpa()
    return {
        impl: AutoModelForCausalLM.from_pretrained(
            tiny_checkpoint, dtype=torch.float32, attn_implementation=impl
        ).eval()
        for impl in (PACKED_SDPA, "sdpa")
    }


def _rows(vocab: int) -> dict[str, torch.Tensor]:
    """Rows of 9, 1 and 14 real tokens (left-padded prompts, right-padded responses)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 16), generator=g)
    attention = torch.zeros_like(ids)
    for row, (start, end) in enumerate([(4, 13), (7, 8), (1, 15)]):
        attention[row, start:end] = 1
    return {"input_ids": ids * attention, "attention_mask": attention}


def _packed_logits(model, packed, attention: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            **attention,
        ).logits[0]


def _packed_and_masked_logits(models, packed) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the packed row with ``packed_sdpa`` (given the spans) and with ``sdpa``
    (the block-diagonal mask its position ids imply)."""
    packed_logits = _packed_logits(models[PACKED_SDPA], packed, packed.attention_kwargs())
    return packed_logits, _packed_logits(models["sdpa"], packed, {})


def test_packed_rows_match_each_row_run_alone(models):
    rows = _rows(models["sdpa"].config.vocab_size)
    packed = pack_rows(rows["input_ids"], rows["attention_mask"], response_width=8)
    logits, masked = _packed_and_masked_logits(models, packed)
    with torch.no_grad():
        alone = torch.cat(
            [
                models["sdpa"](input_ids=rows["input_ids"][r, m.bool()][None]).logits[0]
                for r, m in enumerate(rows["attention_mask"])
            ]
        )
    # Different SDPA kernels sum in different orders: fp32 noise only.
    torch.testing.assert_close(logits, alone, rtol=0, atol=5e-5)
    torch.testing.assert_close(logits, masked, rtol=0, atol=5e-5)
    # Not one causal sequence: the second and third rows must not see the first.
    with torch.no_grad():
        unpacked = models[PACKED_SDPA](input_ids=packed.input_ids, use_cache=False).logits[0]
    assert (unpacked[9:] - alone[9:]).abs().max() > 1e-3


def test_without_spans_it_is_sdpa_with_the_padding_mask(models):
    rows = _rows(models["sdpa"].config.vocab_size)
    with torch.no_grad():
        outputs = [models[impl](**rows).logits for impl in (PACKED_SDPA, "sdpa")]
    mask = rows["attention_mask"].bool()
    torch.testing.assert_close(outputs[0][mask], outputs[1][mask], rtol=0, atol=0)


def test_gradients_match_masked_sdpa(models):
    rows = _rows(models["sdpa"].config.vocab_size)
    packed = pack_rows(rows["input_ids"], rows["attention_mask"], response_width=8)
    grads = {}
    for impl, model in models.items():
        model.zero_grad()
        extra = packed.attention_kwargs() if impl == PACKED_SDPA else {}
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.output_index,
            **extra,
        ).logits[0]
        logits.log_softmax(-1).gather(-1, packed.target_ids[:, None]).sum().backward()
        grads[impl] = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    scale = float(grads["sdpa"].abs().max())
    assert scale > 0.1
    torch.testing.assert_close(grads[PACKED_SDPA], grads["sdpa"], rtol=0, atol=1e-4 * scale)


def test_spans_come_from_the_host_and_cu_seq_lens_alone_still_works(models):
    """With the packing's keywords no layer reads ``cu_seq_lens_q`` back (a device sync
    on GPU); given only ``cu_seq_lens_q`` (as flash-attention callers pass it), the spans
    are read from it, for each packing anew."""
    reads = []

    class CountedLens(torch.Tensor):
        def tolist(self):
            reads.append(self)
            return super().tolist()

    rows = _rows(models["sdpa"].config.vocab_size)
    for order in ([0, 1, 2], [2, 1, 0]):  # spans 9/1/14, then 14/1/9
        packed = pack_rows(rows["input_ids"][order], rows["attention_mask"][order], 8)
        packed = replace(packed, cu_seq_lens=packed.cu_seq_lens.as_subclass(CountedLens))
        logits, masked = _packed_and_masked_logits(models, packed)
        torch.testing.assert_close(logits, masked, rtol=0, atol=5e-5)
        assert reads == []
        kwargs = packed.attention_kwargs()
        del kwargs["packed_spans"]
        from_lens = _packed_logits(models[PACKED_SDPA], packed, kwargs)
        torch.testing.assert_close(from_lens, logits, rtol=0, atol=0)
        assert len(reads) == models[PACKED_SDPA].config.num_hidden_layers
        reads.clear()
