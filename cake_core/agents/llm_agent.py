"""The LLM agent: any OpenAI-compatible endpoint writes Cake IR.

The prompt carries the IR reference (generated from the op registry: the same
text people read), the problem's semantics (never a peer's source), the best
programs so far and the diagnostics of recent failures. Each reply is parsed and
verified at once (on the CPU, in milliseconds); a kernel that does not verify goes
back to the endpoint with its located diagnostics (file:line:col, rule, the line
itself, the hint), for ``repairs`` rounds at most, in the same conversation. Tokens
are counted per attempt (every round of it) and the run's budget is enforced here:
when it is spent the agent asks nothing more, and a kernel still broken is proposed
as it is (the verify stage records why).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from cake_core.agents.base import Candidate, Context
from cake_core.errors import CakeError
from cake_core.ir.check import check_text
from cake_core.ir.text import parse
from cake_core.problems.base import Problem

_CODE = re.compile(r"```(?:python|cake)?\s*\n(.*?)```", re.S)
SYSTEM = ("You write GPU kernels in Cake IR, a typed, hardware-explicit schedule language with Python syntax. "
          "Answer with exactly one complete kernel in a ```python code block and nothing else of substance. "
          "The kernel must keep the parameter names and dimension names of the problem.")


class LLMUnavailable(CakeError):
    pass


@dataclass
class LLMConfig:
    base_url: str | None
    model: str
    api_key: str
    token_budget: int = 200_000
    temperature: float = 0.7
    timeout_s: float = 120.0
    repairs: int = 2                # rounds a kernel that does not verify goes back with its diagnostics
    repair_diagnostics: int = 5     # the first errors a repair round quotes


def extract_program(reply: str) -> str:
    """The IR text of a reply: its first fenced code block, else the whole reply."""
    m = _CODE.search(reply)
    return (m.group(1) if m else reply).strip() + "\n"


def build_prompt(problem: Problem, ctx: Context, reference: str) -> str:
    parts = [
        "# Cake IR reference\n" + reference,
        f"# Problem `{problem.name}`\n{problem.description}\n"
        f"Dimensions: {', '.join(problem.dims)}; tensors: "
        + "; ".join(f"{t.name} ({t.role.value}, {t.dtype})" for t in problem.tensors) + ".",
        "# A correct starting program\n```python\n" + problem.seed_text() + "```",
    ]
    if ctx.best:
        best = "\n".join(f"## score {s:.4g} (lower is better)\n```python\n{t}```" for t, s in ctx.best[:2])
        parts.append("# Best programs so far\n" + best)
    if ctx.feedback:
        parts.append("# Diagnostics of recent failed attempts\n" + "\n\n".join(ctx.feedback[-6:]))
    parts.append("Write one new kernel that is correct on every shape (including dimensions that are not tile "
                 "multiples) and faster than the best so far.")
    return "\n\n".join(parts)


class LLMAgent:
    name = "llm"

    def __init__(self, config: LLMConfig, reference: str):
        from openai import OpenAI
        self.config, self.reference = config, reference
        self.client = OpenAI(base_url=config.base_url, api_key=config.api_key, timeout=config.timeout_s,
                             max_retries=2)
        self.tokens_used = 0

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate]:
        prompt = build_prompt(problem, ctx, self.reference)
        parents = tuple(parse(t).program.hash for t, _ in ctx.best[:2] if parse(t).program is not None)
        out: list[Candidate] = []
        for _ in range(ctx.population):
            if self.tokens_used >= self.config.token_budget:
                break
            out.append(self._attempt(prompt, parents))
        return out

    def _attempt(self, prompt: str, parents: tuple[str, ...]) -> Candidate:
        """One candidate: a reply, then up to ``repairs`` rounds of its own diagnostics while it does not verify
        and the budget lasts; the tokens of every round are the attempt's."""
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        p_tok = c_tok = 0
        for round_ in range(self.config.repairs + 1):
            reply, p, c = self._ask(messages)
            p_tok, c_tok = p_tok + p, c_tok + c
            text = extract_program(reply)
            why = repair_request(text, self.config.repair_diagnostics)
            if why is None or round_ == self.config.repairs or self.tokens_used >= self.config.token_budget:
                break
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": why}]
        return Candidate(text, parents, self.name, None, p_tok, c_tok)

    def _ask(self, messages: list[dict[str, str]]) -> tuple[str, int, int]:
        """The endpoint's reply to ``messages`` and its prompt and completion tokens (counted against the budget)."""
        import openai
        try:
            resp = self.client.chat.completions.create(
                model=self.config.model, temperature=self.config.temperature, messages=messages)
        except openai.APIConnectionError as e:
            raise LLMUnavailable(f"the LLM endpoint {self.config.base_url or 'api.openai.com'} does not "
                                 f"answer ({e.__cause__ or e}); check CAKE_LLM_BASE_URL or use --agent tactic"
                                 ) from None
        except openai.AuthenticationError:
            raise LLMUnavailable("the LLM endpoint refused the API key; set the key in the variable named "
                                 "by llm_api_key_env") from None
        except openai.NotFoundError:
            raise LLMUnavailable(f"the LLM endpoint has no model `{self.config.model}`; set CAKE_LLM_MODEL"
                                 ) from None
        except openai.APIStatusError as e:
            raise LLMUnavailable(f"the LLM endpoint answered HTTP {e.status_code}: {str(e)[:200]}") from None
        usage = resp.usage
        p_tok = usage.prompt_tokens if usage else 0
        c_tok = usage.completion_tokens if usage else 0
        self.tokens_used += p_tok + c_tok
        return ((resp.choices[0].message.content or "") if resp.choices else ""), p_tok, c_tok


def repair_request(text: str, limit: int = 5) -> str | None:
    """What a repair round says of ``text``: its first ``limit`` errors, located as the compiler prints them, and
    the request for the whole corrected kernel; None when it parses and verifies."""
    errors = [d for d in check_text(text, "candidate.cake") if d.is_error]
    if not errors:
        return None
    shown = "\n".join(d.format("candidate.cake", text) for d in errors[:limit])
    more = f"\n(and {len(errors) - limit} more)" if len(errors) > limit else ""
    return (f"The kernel does not verify ({len(errors)} error{'s' if len(errors) > 1 else ''}):\n{shown}{more}\n"
            "Fix these and answer with the whole corrected kernel in one ```python code block.")
