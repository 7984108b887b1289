"""The LLM agent against a local OpenAI-compatible endpoint (a stub server on loopback)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cake_core.agents.base import Context
from cake_core.agents.llm_agent import LLMAgent, LLMConfig, LLMUnavailable, build_prompt, extract_program
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem

GEMM = get_problem("gemm_bf16")
REPLY = "Here is a faster one:\n```python\n" + GEMM.seed_text().replace('"BK": 32', '"BK": 64') + "```\n"


class _Scripted(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose reply ``answer(messages)`` gives: (content, prompt tokens,
    completion tokens)."""

    def answer(self, messages: list) -> tuple[str, int, int]:
        raise NotImplementedError

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content, p_tok, c_tok = self.answer(body["messages"])
        out = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
               "usage": {"prompt_tokens": p_tok, "completion_tokens": c_tok, "total_tokens": p_tok + c_tok}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def _serve(handler):
    srv = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"


class _Endpoint(_Scripted):
    prompts: list = []

    def answer(self, messages):
        _Endpoint.prompts.append(messages[-1]["content"])
        return REPLY, 1200, 300


@pytest.fixture
def endpoint():
    srv, url = _serve(_Endpoint)
    yield url
    srv.shutdown()


def test_proposes_parsed_programs_and_counts_tokens(endpoint):
    agent = LLMAgent(LLMConfig(endpoint, "stub-model", "k", token_budget=3500), reference="(reference)")
    ctx = Context(0, 1, 4, feedback=["candidate.cake:7:9: error[races.smem]: read-after-write race"])
    cands = agent.propose(GEMM, ctx)
    assert len(cands) == 3, "the budget (3500 tokens at 1500 a reply) stops the fourth request"
    assert all(c.prompt_tokens == 1200 and c.completion_tokens == 300 for c in cands)
    assert parse_program(cands[0].text).const_env["BK"] == 64
    prompt = _Endpoint.prompts[-1]
    assert "(reference)" in prompt and "races.smem" in prompt and GEMM.description in prompt


def test_unreachable_endpoint_is_one_clear_message():
    agent = LLMAgent(LLMConfig("http://127.0.0.1:9/v1", "m", "k", timeout_s=2), reference="")
    with pytest.raises(LLMUnavailable, match=r"does not answer .*CAKE_LLM_BASE_URL"):
        agent.propose(GEMM, Context(0, 0, 1))


def test_extract_program_and_prompt():
    assert extract_program("```python\nx\n```") == "x\n"
    assert extract_program("no fence") == "no fence\n"
    p = build_prompt(GEMM, Context(0, 0, 1, best=[(GEMM.seed_text(), 1.5)]), "REF")
    assert "score 1.5" in p and p.startswith("# Cake IR reference\nREF")


# ---------------------------------------------------------------- the repair loop
GOOD = GEMM.seed_text()
BROKEN = GOOD.replace("mma(acc, a_s, b_s)", "mma(acc, a_t, b_s)", 1)     # `a_t` is not defined


class _Repairing(_Scripted):
    """A broken kernel first; the corrected one once it is shown the diagnostics."""
    conversations: list = []

    def answer(self, messages):
        _Repairing.conversations.append(messages)
        fixed = "does not verify" in messages[-1]["content"]
        return "```python\n" + (GOOD if fixed else BROKEN) + "```\n", 1000, 200


@pytest.fixture
def repairing():
    _Repairing.conversations = []
    srv, url = _serve(_Repairing)
    yield url
    srv.shutdown()


def test_a_kernel_that_does_not_verify_goes_back_with_its_located_diagnostics(repairing):
    assert "mma(acc, a_t, b_s)" in BROKEN
    agent = LLMAgent(LLMConfig(repairing, "stub-model", "k"), reference="(reference)")
    (cand,) = agent.propose(GEMM, Context(0, 1, 1))
    assert cand.text == GOOD and (cand.prompt_tokens, cand.completion_tokens) == (2000, 400)
    first, second = _Repairing.conversations
    assert len(first) == 2 and len(second) == 4 and second[2]["role"] == "assistant"
    line = next(i for i, ln in enumerate(BROKEN.splitlines(), 1) if "a_t" in ln)
    ask = second[3]["content"]
    assert f"candidate.cake:{line}:" in ask and "types.undefined" in ask and "a_t" in ask
    assert "whole corrected kernel" in ask


def test_repairs_stop_at_their_rounds_and_at_the_budget(repairing):
    never = LLMAgent(LLMConfig(repairing, "stub-model", "k", repairs=0), reference="")
    (cand,) = never.propose(GEMM, Context(0, 1, 1))
    assert cand.text == BROKEN and len(_Repairing.conversations) == 1, "no repair round: proposed as it is"
    _Repairing.conversations = []
    poor = LLMAgent(LLMConfig(repairing, "stub-model", "k", token_budget=1000), reference="")
    cands = poor.propose(GEMM, Context(0, 1, 3))
    assert [c.text for c in cands] == [BROKEN] and len(_Repairing.conversations) == 1
    assert poor.tokens_used == 1200, "the first reply spent the budget: no repair, no second candidate"


def test_a_verifying_kernel_asks_nothing_more():
    from cake_core.agents.llm_agent import repair_request
    assert repair_request(GOOD) is None
    ask = repair_request(BROKEN, limit=1)
    assert ask.startswith("The kernel does not verify (") and ask.count("candidate.cake:") == 1
