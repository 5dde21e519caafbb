"""What every fact module shares: `Maybe[T]`, a fact or the reason it is unknown, and `NOT_READ`.

Its own module, below agent.facts and the per-source fact modules (agent.facts_nvml,
agent.facts_bmc), so that they can use it and agent.facts can re-export them without a circle.
"""

from __future__ import annotations

from typing import TypeAlias, TypeVar, Union

from agent.model import Unknown

T = TypeVar("T")
# A fact or the reason it is unknown. Union[] because mypy rejects `T | X` aliases.
Maybe: TypeAlias = Union[T, Unknown]  # noqa: UP007

NOT_READ = Unknown("not read")  # immutable, so one shared default is safe
