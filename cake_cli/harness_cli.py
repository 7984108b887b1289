"""``cake harness``: review the harness's proposals and list its versions.

    cake harness proposals                      # each proposal's latest state
    cake harness approve ID --reason TEXT       # it becomes part of a new harness version
    cake harness reject ID --reason TEXT
    cake harness review [--policy manual]       # mine the warehouse, gate on the corpus, pause for a person
    cake harness versions
    cake harness import-runs HOME               # another home's runs, for the next review to mine with these

A decision reaches a paused review flow through this home's Prefect server.
"""
from __future__ import annotations

import getpass

import typer

from cake_cli.display import columns_rows, console, print_result
from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import settings as _settings
from cake_cli.invocation import warehouse as _warehouse
from cake_cli.services import gpu_policy, prefect_server

harness_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                          rich_markup_mode=None,
                          help="Review harness proposals and list harness versions.")

# What a person reviewing proposals needs on one screen; the JSON evidence is one `cake sql` away.
PROPOSALS_QUERY = ("select proposal_id, kind, status, title, created_at from proposals_latest "
                   "order by created_at, proposal_id")
# each version with what its change did since (warehouse view harness_effects): a rule's stopped candidates and
# the GPU-seconds saved, the attempts and winners that used a primitive or a macro, the attempts a refit ranked
VERSIONS_QUERY = ("select v.version, v.parent, coalesce(e.kind, 'built-in') as change, e.name, e.stopped, "
                  "round(e.gpu_s_saved, 1) as gpu_s_saved, e.used, e.winners, e.ranked, v.proposal_id, "
                  "v.created_at from harness_versions v left join harness_effects e using (version) "
                  "order by v.version")


@harness_app.command("proposals")
@cli_errors
def harness_proposals() -> None:
    """List harness proposals with their latest state."""
    result = _warehouse(_settings()).query(PROPOSALS_QUERY)
    print_result(console, result, empty="no proposals yet")
    if columns_rows(result)[1]:
        _say("approve:  cake harness approve ID --reason TEXT")
        _say("reject:   cake harness reject ID --reason TEXT")
        _say("evidence: cake sql \"select * from proposals_latest where proposal_id = 'ID'\"")


def _decide(proposal_id: str, approve: bool, reason: str) -> None:
    settings = _settings()
    from flows.harness import decide_proposal

    with prefect_server(settings):  # a paused review flow is resumed through the Prefect API
        result = decide_proposal(proposal_id, approve=approve, reason=reason,
                                 decided_by=getpass.getuser(),
                                 warehouse_root=str(settings.warehouse_root))
    said = f"{'approved' if approve else 'rejected'} proposal {proposal_id}"
    if isinstance(result, int) and not isinstance(result, bool):  # the new harness version
        said += f": harness version {result} created"
    elif isinstance(result, str) and result:
        said += f": {result}"
    _say(said)


@harness_app.command("approve", no_args_is_help=True)
@cli_errors
def harness_approve(
    proposal_id: str = typer.Argument(..., metavar="ID", help="Proposal id (see `cake harness proposals`)."),
    reason: str = typer.Option(..., "--reason", help="Why (required; kept with the decision)."),
) -> None:
    """Approve a proposal, with the reason: it becomes part of a new harness version."""
    if not reason.strip():
        raise UsageError("--reason must say why the proposal is approved")
    _decide(proposal_id, True, reason)


@harness_app.command("reject", no_args_is_help=True)
@cli_errors
def harness_reject(
    proposal_id: str = typer.Argument(..., metavar="ID", help="Proposal id (see `cake harness proposals`)."),
    reason: str = typer.Option(..., "--reason", help="Why (required; kept with the decision)."),
) -> None:
    """Reject a proposal, with the reason."""
    if not reason.strip():
        raise UsageError("--reason must say why the proposal is rejected")
    _decide(proposal_id, False, reason)


@harness_app.command("review")
@cli_errors
def harness_review(
    min_support: int = typer.Option(3, "--min-support", min=1,
                                    help="Failing attempts a cluster needs before a proposal is mined."),
    timeout_h: float = typer.Option(24.0, "--timeout-h", min=0.01, help="How long each proposal waits for a person."),
    policy: str = typer.Option("manual", "--policy",
                               help="Who decides what passed the corpus gate: manual (pause for a person), "
                                    "approve-gated (approve it at once) or record-only (leave it pending)."),
) -> None:
    """Mine the warehouse into proposals (rules, primitives, calibrations, macro tactics), gate each on the
    kernel corpus, and pause on each until a person decides.

    Approve or reject in the Prefect UI (the paused run asks for a decision), or from
    another terminal with `cake harness approve ID` / `cake harness reject ID --reason R`.
    """
    from flows.harness import POLICIES
    if policy not in POLICIES:
        raise UsageError(f"--policy must be one of {', '.join(POLICIES)}, not `{policy}`")
    settings = _settings()
    _warehouse(settings)
    with prefect_server(settings) as pf:
        from flows.harness import harness_review_flow

        _say(f"reviewing failure clusters in {settings.warehouse_root}; paused proposals wait in "
             f"the Prefect UI at {pf.ui_url} or for `cake harness approve ID`")
        gpus = gpu_policy(settings)     # where there is a GPU, the corpus gate checks the corpus on it too
        results = harness_review_flow(warehouse_root=str(settings.warehouse_root), min_support=min_support,
                                      pause_timeout_s=int(timeout_h * 3600), policy=policy,
                                      gpu_cache_dir=str(settings.cache_dir) if gpus else None)
    if not results:
        _say("no cluster yielded a proposal")
    for r in results:
        extra = f", harness version {r['new_version']}" if r.get("new_version") else ""
        _say(f"proposal {r['proposal_id']}: {r['decision']}{extra}")


@harness_app.command("versions")
@cli_errors
def harness_versions() -> None:
    """List harness versions, newest last, each with what its change did since over every run of the home: the
    candidates a rule stopped before the compiler and the GPU-seconds that saved (estimated from what its
    failure cluster cost before), the attempts and run winners that used a primitive or a macro, the attempts
    a calibration ranked (each version is also exported as <home>/harness/harness-vN.json)."""
    print_result(console, _warehouse(_settings()).query(VERSIONS_QUERY),
                  empty="no harness versions yet")


@harness_app.command("import-runs", no_args_is_help=True)
@cli_errors
def harness_import_runs(
    home: str = typer.Argument(..., metavar="HOME", help="Another Cake home (or its warehouse) whose runs to import."),
) -> None:
    """Import another home's runs (attempts, checks, measurements...) into this home's warehouse, so the next
    `cake harness review` mines them with this home's: failure clusters, and primitives and macros that need wins
    on two problems. Copies only what is not here yet; the other home's harness stays its own."""
    from warehouse.merge import import_runs

    wh = _warehouse(_settings())
    before = wh.query("select count(distinct run_id) as n from attempts").to_pylist()[0]["n"]
    copied = import_runs(wh, home)
    after = wh.query("select count(distinct run_id) as n from attempts").to_pylist()[0]["n"]
    files = sum(copied.values())
    _say(f"imported {files} batch file(s) from {home}: runs with attempts here {before} -> {after}"
         if files else f"nothing new in {home}: its runs are here already")
