"""Per-request state and token sampling for ``HFEngine``: temperature, top-k, top-p, seeds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from agentrl.core.types import SamplingParams, TokenOutput


@dataclass(eq=False)
class HFRequest:
    """One request, from queueing until its output is delivered."""

    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    generator: torch.Generator
    future: asyncio.Future[TokenOutput]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_cached: int = 0
    epoch: int = -1  # weight epoch its KV was computed under
    aborted: bool = False
    finish_reason: str | None = None
    error: Exception | None = None

    @property
    def done(self) -> bool:
        """Finished (by a stop condition or an error) or asked to abort."""
        return self.aborted or self.finish_reason is not None or self.error is not None

    def advance(self, logits: torch.Tensor, version: int, eos_ids: set[int]) -> None:
        """Sample the next token from ``logits`` (weights ``version``); stop if it ends here."""
        token, logprob = sample_token(logits, self.sampling, self.generator)
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if token in self.sampling.stop_token_ids or (
            token in eos_ids and not self.sampling.ignore_eos
        ):
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"

    def output(self, weight_version: int) -> TokenOutput:
        """The ``TokenOutput`` so far (``finish_reason="abort"`` if it did not finish)."""
        return TokenOutput(
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason or "abort",
            num_cached_tokens=self.num_cached,
            weight_version=weight_version,
            token_versions=list(self.versions),
            num_prompt_tokens=len(self.prompt),
        )


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``, owned by one request."""
    return torch.Generator().manual_seed(seed)


def sample_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
) -> tuple[int, float]:
    """Sample one token from a ``(vocab,)`` logits row; return it and its raw logprob.

    The logprob is taken from the model's distribution before temperature / top-k / top-p
    (vLLM's default ``logprobs_mode="raw_logprobs"``). ``temperature == 0`` is greedy.
    """
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if sampling.temperature == 0:
        token = int(torch.argmax(logits))
    else:
        scores = _top_p(_top_k(logits / sampling.temperature, sampling.top_k), sampling.top_p)
        # Drawn on the generator's device (the request's CPU generator), wherever the model
        # runs: a seed gives the same stream on CPU and GPU, and a CUDA multinomial would
        # reject a CPU generator.
        probs = torch.softmax(scores, dim=-1).to(generator.device)
        token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Mask every score below the ``k``-th largest (``k == -1``: keep all)."""
    if k == -1 or k >= scores.numel():
        return scores
    kth = torch.topk(scores, k).values[-1]
    return scores.masked_fill(scores < kth, float("-inf"))


def _top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of top tokens whose probability mass reaches ``p``."""
    if p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=True)
    probs = torch.softmax(sorted_scores, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))
