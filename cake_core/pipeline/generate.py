"""The generate stage: the run's agent proposes a generation's candidates, each becoming an attempt."""
from __future__ import annotations

import os
from typing import Any

from cake_core.agents import tactics as tactics_table
from cake_core.agents.base import Context
from cake_core.errors import CakeError
from cake_core.harness.version import HarnessSpec
from cake_core.pipeline.attempt import Attempt
from cake_core.problems import get_problem

AGENTS = ("tactic", "llm")


def make_agent(kind: str, seed: int, harness: HarnessSpec | None = None, llm: dict[str, Any] | None = None):
    """The agent of a run: ``tactic`` (offline, deterministic under ``seed``; the harness adds its macro tactics,
    disables tactics, and has the agent read and write its composite ops) or ``llm`` (an OpenAI-compatible
    endpoint; ``llm``: base_url, model, api_key_env; its reference lists the harness's composites)."""
    harness = harness or HarnessSpec()
    if kind == "tactic":
        from cake_core.agents.tactic_agent import TacticAgent
        return TacticAgent(seed, harness.tactics(tactics_table.TACTICS), read=harness.read, write=harness.write)
    if kind == "llm":
        from cake_core.agents.llm_agent import LLMAgent, LLMConfig
        from cake_core.ir.reference import render_reference
        cfg = dict(llm or {})
        if not cfg.get("model"):
            raise CakeError("the llm agent needs a model: set CAKE_LLM_MODEL")
        key = os.environ.get(cfg.pop("api_key_env", "OPENAI_API_KEY"), "")
        reference = render_reference() + "".join("\n" + c.reference() for c in harness.composites)
        return LLMAgent(LLMConfig(api_key=key, **cfg), reference)
    raise CakeError(f"unknown agent `{kind}`; use {' or '.join(AGENTS)}")


def generate_stage(agent, run_id: str, problem: str, harness_version: int, ctx: Context) -> list[Attempt]:
    """This generation's attempts, one per candidate the agent proposes (at most ``ctx.population``)."""
    cands = agent.propose(get_problem(problem), ctx)[: ctx.population]
    return [Attempt(run_id, ctx.generation, i, problem, harness_version, c) for i, c in enumerate(cands)]
