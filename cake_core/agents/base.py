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
    tactic: str | None = None      # this step's tactics, "+"-joined ("seed" for the seed itself)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    lineage: tuple[str, ...] = ()  # every tactic applied since the seed, in order (the parent's lineage first)


@dataclass(frozen=True)
class Scored:
    """A candidate that was checked or measured: its text, score (lower is better), lineage and its
    parent's score (None for the seed), which is what a tactic's track record is made of."""

    text: str
    score: float
    lineage: tuple[str, ...] = ()
    parent_score: float | None = None


@dataclass(frozen=True)
class Refusal:
    """A tactic that did not apply to a parent, and why (its precondition's reason)."""

    tactic: str
    parent: str                    # IR hash
    reason: str


@dataclass
class Context:
    """What the agent sees: the harness version, the scored candidates so far, the budget left.

    ``cold``: the run starts from the problem's naive seed alone; its hand-written kernels are references to
    beat, never offered as candidates or parents (a warm run passes them in ``known``). An agent draws its
    random numbers from (the run's seed, ``generation``) alone, so a resumed run proposes what the
    uninterrupted one would have.
    """

    harness_version: int
    generation: int
    population: int
    best: list[tuple[str, float]] = field(default_factory=list)      # (IR text, score: lower is better)
    tactic_stats: dict[str, tuple[int, int]] = field(default_factory=dict)  # tactic -> (tried, faster than parent)
    seen: set[str] = field(default_factory=set)                      # IR hashes already tried
    feedback: list[str] = field(default_factory=list)                # diagnostics of recent failures
    scored: list[Scored] = field(default_factory=list)               # every checked/measured candidate of the run
    bounds: dict[str, int] = field(default_factory=dict)             # largest search-shape value of each dim
    cold: bool = False                                               # the naive seed alone: no hand-written kernels
    known: list[str] = field(default_factory=list)                   # hand-written programs a warm run offers first
    seed: int = 0                                                    # the run's seed: generation g draws from (seed, g)
    candidates_left: int | None = None                               # None: no candidate budget
    gpu_minutes_left: float | None = None                            # None: no GPU-time budget
    shape_winners: list[Scored] = field(default_factory=list)        # the fastest measured on each headline shape


class Agent(Protocol):
    name: str

    def propose(self, problem: Problem, context: Context) -> list[Candidate]: ...
