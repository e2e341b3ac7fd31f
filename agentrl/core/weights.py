"""The wire format of a weight push: how a bucket of tensors is laid out in one buffer.

Both sides of every weight transport read it: the trainer's sender
(``agentrl.server.weight_transport``) plans the buckets, and the replicas' receivers
(the same transport's module, its vLLM-worker half) view the tensors out of the buffer they
receive. A plan is plain data (names, dtype names, shapes, byte offsets), with no torch
in it, and crosses process boundaries as nested lists (``to_wire``), because vLLM's
``collective_rpc`` serializes arguments with msgpack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ALIGN_BYTES = 64
"""Offsets of tensors inside a bucket buffer are multiples of this (any dtype can be viewed)."""

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of each dtype a weight may have (torch's names, without ``torch.``)."""


def dtype_name(dtype: Any) -> str:
    """The name of ``dtype`` (a ``torch.dtype`` or its name, with or without ``torch.``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; weights may be {sorted(DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in its bucket buffer."""

    name: str
    dtype: str  # torch dtype without the "torch." prefix
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= int(dim)
        return numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class BucketPlan:
    """The layout of one bucket buffer."""

    slots: tuple[TensorSlot, ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: Sequence[tuple[str, Any, Sequence[int]]]) -> BucketPlan:
        """Lay out ``(name, dtype, shape)`` entries back to back, ``ALIGN_BYTES`` aligned."""
        slots, offset = [], 0
        for name, dtype, shape in tensors:
            slot = TensorSlot(name, dtype_name(dtype), tuple(int(d) for d in shape), offset)
            slots.append(slot)
            offset = -(-(offset + slot.nbytes) // ALIGN_BYTES) * ALIGN_BYTES
        return cls(tuple(slots), offset)

    def to_wire(self) -> list[list[Any]]:
        return [[s.name, s.dtype, list(s.shape), s.offset] for s in self.slots] + [[self.nbytes]]

    @classmethod
    def from_wire(cls, wire: Sequence[Sequence[Any]]) -> BucketPlan:
        *slots, (nbytes,) = wire
        return cls(
            tuple(TensorSlot(n, d, tuple(int(x) for x in s), int(o)) for n, d, s, o in slots),
            int(nbytes),
        )


def plan_wire(plans: Sequence[BucketPlan]) -> list[list[list[Any]]]:
    """Several bucket plans in the msgpack-friendly form workers receive."""
    return [p.to_wire() for p in plans]


def plans_from_wire(wire: Sequence[Sequence[Sequence[Any]]]) -> list[BucketPlan]:
    return [BucketPlan.from_wire(w) for w in wire]
