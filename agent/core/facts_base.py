"""What every fact module shares: `Maybe[T]`, a fact or the reason it is unknown, and `NOT_READ`.

Its own module, below agent.core.facts and the per-source fact modules (agent.core.facts_nvml,
agent.core.facts_bmc), so that they can use it and agent.core.facts can re-export them without a circle.
"""

from __future__ import annotations

from typing import TypeAlias, TypeVar, Union

from agent.core.model import Unknown

T = TypeVar("T")
# A fact or the reason it is unknown. Union[] because mypy rejects `T | X` aliases.
Maybe: TypeAlias = Union[T, Unknown]  # noqa: UP007

NOT_READ = Unknown("not read")  # immutable, so one shared default is safe
