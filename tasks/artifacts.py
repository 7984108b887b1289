"""What a run and a review show in the Prefect UI: artifacts, the flow run's name, a proposal's evidence.

- per generation: a Markdown artifact (candidates by outcome, the best so far with its predicted and measured
  geomean, per-shape results) and a table artifact of the per-shape results (:func:`generation_artifact`);
- at the end of a run: the leaderboard, the run's best beside the hand-written kernels and the peer, per shape
  too, with the best kernel's IR (:func:`leaderboard_artifact`);
- per proposal: its definition, cluster, examples and gate report (:func:`proposal_markdown`), as an
  artifact and as the description of the paused run's form; once decided, the decision
  (:func:`decision_artifact`).

Artifact keys name the run (``<run>-generation``, ``<run>-leaderboard``, ``proposal-<id>``): each new
generation is a new version of its run's key, and every version stays on its flow run's page.
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from tasks.results import generation_rows, leaderboard_rows, shape_rows

if TYPE_CHECKING:
    from tasks.run import Run

_TASK = dict(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)     # retries: the API is I/O
EXAMPLES = 3            # failing attempts a proposal's description quotes
EXAMPLE_CHARS = 1500    # of each example's IR text


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) made of ``parts``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def ms(v: float | None) -> str:
    """A time in ms for a table: 4 significant digits, a dash for none."""
    return "–" if v is None else f"{v:.4g}"


def times(v: float | None) -> str:
    """A speed-up factor for a table."""
    return "–" if v is None else f"{v:.2f}×"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (cells' ``|`` escaped)."""
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def shown(log: Any, what: str, state: Any) -> Any:
    """The result of a UI task run with ``return_state=True``; one that failed is logged as a warning and
    gives None: what the UI shows never stops a run or a review, whose rows are in the warehouse."""
    if state.is_failed():
        log.warning(f"{what} not published: {state.message}")
        return None
    return state.result()


def run_name(plan: Any, harness_version: int) -> str:
    """A run's flow-run name: what it is (problem, shape set, harness version, cold or warm) and its id."""
    return (f"{plan.problem} · {plan.shape_set} · harness v{harness_version} · "
            f"{'cold' if plan.cold else 'warm'} · {plan.run_id}" + (f" · job {plan.session}" if plan.session else ""))


@task(name="name-run", **_TASK)
def name_flow_run(run: "Run") -> str:
    """Rename the current flow run for what the run turned out to be (a resume's values come from the
    warehouse); returns the name."""
    name = run_name(run.plan, run.harness.version)
    if flow_run.id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)
    return name


# ---------------------------------------------------------------- a generation

def generation_markdown(g: dict[str, Any], timed: bool) -> str:
    """The Markdown of one generation (see :func:`tasks.results.generation_rows`)."""
    out = [f"# Generation {g['generation']}", "", f"{g['attempts']} candidates in this generation.", "",
           "## Candidates by outcome", "", md_table(["outcome", "candidates"], [[k, v] for k, v in g["outcomes"].items()])
           if g["outcomes"] else "No candidate.", "", "## Best so far", ""]
    b = g["best"]
    if b is None:
        out.append("No kernel scored yet.")
    else:
        out += [md_table(["kernel", "generation", "tactic", "predicted geomean ms", "measured geomean ms"],
                         [[b["attempt_id"], b["generation"], b["tactic"] or "(seed)", ms(b["predicted_ms"]),
                           ms(b["measured_ms"]) if timed else "not timed (no GPU)"]])]
    out += ["", "## Per shape", "", _shape_table(g["shapes"], timed) if g["shapes"] else "No shape scored yet."]
    return "\n".join(out)


def _shape_table(shapes: list[dict[str, Any]], timed: bool) -> str:
    ok = {True: "correct", False: "wrong", None: "–"}
    return md_table(["shape", "best: predicted ms", "best: check", "best: measured ms", "fastest so far ms"],
                    [[s["shape"], ms(s["predicted_ms"]), ok[s["correct"]],
                      ms(s["measured_ms"]) if timed else "not timed", ms(s["fastest_so_far_ms"])] for s in shapes])


@task(name="generation-artifact", task_run_name="artifacts g{generation}", **_TASK)
def generation_artifact(warehouse_root: str, run_id: str, generation: int, timed: bool) -> dict[str, Any]:
    """Publish generation ``generation``'s Markdown and per-shape table; returns its rows."""
    g = generation_rows(warehouse_root, run_id, generation)
    create_markdown_artifact(generation_markdown(g, timed), key=artifact_key(run_id, "generation"),
                             description=f"run {run_id}, generation {generation}")
    if g["shapes"]:
        create_table_artifact([{**s, "generation": generation} for s in g["shapes"]],
                              key=artifact_key(run_id, "shapes"),
                              description=f"run {run_id}, generation {generation}: the best so far per shape")
    return g


# ---------------------------------------------------------------- the end of a run

def leaderboard_markdown(run_id: str, board: list[dict[str, Any]], shapes: list[dict[str, Any]],
                         best_ir: str | None, level: int = 1) -> str:
    """The run's leaderboard (see :func:`tasks.results.leaderboard_rows` and ``shape_rows``) as Markdown,
    its title a heading of ``level``."""
    h = "#" * level
    out = [f"{h} Leaderboard of run {run_id}", "",
           "Geomean over the searched shapes; *vs run best* above 1 means the run's best is faster.", ""]
    out.append(md_table(["rank", "kernel", "source", "basis", "geomean ms", "vs run best", "correct"],
                        [[i + 1, r["name"], r["source"], r["basis"] or "–", ms(r["score_ms"]), times(r["vs_run_best"]),
                          {True: "yes", False: "no", None: "not checked"}[r["correct"]]]
                         for i, r in enumerate(board)]) if board else "Nothing was scored.")
    if shapes:
        out += ["", f"{h}# Per shape", "", "Speed-up of the run over each (above 1: the run is faster).", "",
                md_table(["shape", "role", "run ms", "basis", "hand-written best", "ms", "speed-up", "peer", "ms",
                          "speed-up"],
                         [[s["shape"], s["role"], ms(s["run_ms"]), s["run_basis"] or "–", s["hand_written"] or "–",
                           ms(s["hand_written_ms"]), times(s["vs_hand_written"]), s["peer"] or "–", ms(s["peer_ms"]),
                           times(s["vs_peer"])] for s in shapes])]
    if best_ir:
        out += ["", f"{h}# The best kernel", "", "```python", best_ir.rstrip(), "```"]
    return "\n".join(out)


@task(name="leaderboard-artifact", **_TASK)
def leaderboard_artifact(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """Publish the run's leaderboard (Markdown, with the best kernel's IR) and its table; returns the table."""
    from warehouse.queries import run_best

    board = leaderboard_rows(warehouse_root, run_id)
    best = run_best(warehouse_root, run_id)
    create_markdown_artifact(leaderboard_markdown(run_id, board, shape_rows(warehouse_root, run_id),
                                                  best["ir_text"] if best else None),
                             key=artifact_key(run_id, "leaderboard"), description=f"run {run_id}: leaderboard")
    if board:
        create_table_artifact(board, key=artifact_key(run_id, "leaderboard-table"),
                              description=f"run {run_id}: its best beside the hand-written kernels and the peers")
    return board


# ---------------------------------------------------------------- proposals

def _block(obj: Any) -> str:
    return "```json\n" + json.dumps(obj, indent=2, default=str, sort_keys=True) + "\n```"


def proposal_markdown(proposal_id: str, kind: str, title: str, evidence: dict[str, Any], payload: dict[str, Any],
                      gate: dict[str, Any]) -> str:
    """A proposal as a reviewer reads it: its definition (for a rule, the predicate in words), the failure
    cluster it came from, examples with their IR excerpts, the rest of its evidence and the corpus gate's
    report. Examples beyond :data:`EXAMPLES` are left out (the warehouse keeps all of them)."""
    ev = {k: v for k, v in evidence.items() if k not in ("key", "gate")}
    definition = ev.pop("definition", None) or {}
    cluster = ev.pop("cluster", None)
    examples = ev.pop("examples", None) or []
    out = [f"# Proposal {proposal_id}: {title}", "", f"**Kind**: {kind}", "", "## Definition", ""]
    for label, k in (("Condition", "text"), ("In words", "in_words"), ("Message", "message"), ("Hint", "hint"),
                     ("Signature", "signature")):
        if isinstance(definition.get(k), str) and definition[k]:
            out += [f"- **{label}**: {definition[k]}"]
    out += ["", _block(definition or payload)]
    if cluster is not None:
        out += ["", "## Cluster", "", _block(cluster)]
    if examples:
        out += ["", f"## Examples ({min(len(examples), EXAMPLES)} of {len(examples)})", ""]
        for ex in examples[:EXAMPLES]:
            ex = dict(ex) if isinstance(ex, dict) else {"example": ex}
            text = ex.pop("excerpt", None)
            out += [_block(ex), ""]
            if text:
                out += ["```", str(text)[:EXAMPLE_CHARS].rstrip(), "```", ""]
    if ev:
        out += ["## Further evidence", "", _block(ev), ""]
    out += [f"## Corpus gate: {'passed' if gate.get('passed') else 'refused'}", ""]
    if gate.get("refusals"):
        out += ["Refusals:", ""] + [f"- {r}" for r in gate["refusals"]] + [""]
    out += [_block(gate), "", "---", "",
            "Decide below: pick **approve** or **reject** and say why (both are required)."]
    return "\n".join(out)


def proposal_description(row: dict[str, Any]) -> str:
    """:func:`proposal_markdown` of a ``proposals`` row (its JSON columns parsed)."""
    load = lambda s: json.loads(s) if s else {}  # noqa: E731
    return proposal_markdown(row["proposal_id"], row["kind"], row["title"], load(row["evidence"]),
                             load(row["payload"]), load(row["gate_report"]))


@task(name="proposal-artifact", task_run_name="proposal {proposal_id}", **_TASK)
def proposal_artifact(warehouse_root: str, proposal_id: str) -> str:
    """Publish a recorded proposal's evidence as an artifact; returns its Markdown (the pause form's
    description)."""
    from tasks.harness import get_proposal

    md = proposal_description(get_proposal(warehouse_root, proposal_id))
    create_markdown_artifact(md, key=artifact_key("proposal", proposal_id),
                             description=f"proposal {proposal_id}: evidence and gate report")
    return md


@task(name="harness-record-artifact", **_TASK)
def harness_record_artifact(warehouse_root: str) -> str | None:
    """Publish what each approved harness change did since its version (``harness_effects``); None when there
    is no approved change yet."""
    from warehouse import Warehouse

    rows = Warehouse(warehouse_root).query("select * from harness_effects order by version").to_pylist()
    if not rows:
        return None
    fmt = lambda v, f="{}": "–" if v is None else f.format(v)     # noqa: E731
    md = "\n".join(["# The harness's record", "",
                    "What each approved change did from its version on, over every run of this warehouse.", "",
                    md_table(["version", "kind", "name", "stopped", "GPU-s saved (est.)", "used", "winners",
                              "ranked", "title"],
                             [[f"v{r['version']}", r["kind"], fmt(r["name"]), fmt(r["stopped"]),
                               fmt(r["gpu_s_saved"], "{:.1f}"), fmt(r["used"]), fmt(r["winners"]), fmt(r["ranked"]),
                               r["title"]] for r in rows])])
    create_markdown_artifact(md, key="harness-record", description="what each approved harness change did")
    return md


@task(name="decision-artifact", task_run_name="decision {proposal_id}", **_TASK)
def decision_artifact(proposal_id: str, title: str, decision: str, reason: str, decided_by: str,
                      new_version: int | None) -> None:
    """Publish the decision on a proposal beside its evidence."""
    md = "\n".join([f"# Proposal {proposal_id}: {decision}", "", f"**{title}**", "",
                    md_table(["decision", "reason", "decided by", "new harness version"],
                             [[decision, reason, decided_by, "–" if new_version is None else f"v{new_version}"]])])
    create_markdown_artifact(md, key=artifact_key("decision", proposal_id),
                             description=f"proposal {proposal_id}: {decision} by {decided_by}")
