"""The agent interface: ``Agent.propose(problem, context) -> candidates``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cake_core.problems.base import Problem


@dataclass(frozen=True)
class Candidate:
    text: str                      # IR text as the agent wrote it
    parents: tuple[str, ...] = ()  # IR hashes
    agent: str = "tactic"
    tactic: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Context:
    """What the agent sees: the harness version, the best so far, the budget left.

    ``cold``: the run starts from the problem's naive seed alone; its hand-written kernels are references to
    beat, never offered as candidates or parents. An agent draws its random numbers from (its seed,
    ``generation``) alone, so a resumed run proposes what the uninterrupted one would have.
    """

    harness_version: int
    generation: int
    population: int
    best: list[tuple[str, float]] = field(default_factory=list)      # (IR text, score: lower is better)
    tactic_stats: dict[str, tuple[int, int]] = field(default_factory=dict)  # tactic -> (tried, succeeded)
    seen: set[str] = field(default_factory=set)                      # IR hashes already tried
    feedback: list[str] = field(default_factory=list)                # diagnostics of recent failures
    cold: bool = False
    candidates_left: int | None = None                               # None: no candidate budget
    gpu_minutes_left: float | None = None                            # None: no GPU-time budget


class Agent(Protocol):
    name: str

    def propose(self, problem: Problem, context: Context) -> list[Candidate]: ...
