"""The Prefect UI in a real browser: headless Chromium (the system's, driven by Playwright) against the local
server. A run's page shows its artifacts (generation tables, leaderboard, the published report); a paused
proposal shows its evidence; the form refuses an untouched submit, and a filled one resumes the flow, which
records and logs the decision.

The flow and API checks run without a browser too; the browser checks skip, saying why, only when no
Chromium binary is installed (``apt-get install -y chromium``; ``.ci/run`` installs it). With
``CAKE_SCREENSHOTS=DIR`` the pages are saved there (the screenshots under docs/ come from this test).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from warehouse import Warehouse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))   # harness_runs: H200 measurements

pytestmark = [pytest.mark.services, pytest.mark.browser]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WAIT_MS = 120_000         # any one page condition, on a busy 2-core machine
RUN_ID = "ui-run"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _until(what: str, check, timeout_s: float = 240.0):
    """Poll ``check`` until it returns something truthy; fail saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.5)
    pytest.fail(f"{what} within {timeout_s:.0f} s")


def _api(call):
    """``call(client)`` with Prefect's sync client (Playwright's sync API holds this thread's event loop)."""
    from prefect.client.orchestration import get_client
    with get_client(sync_client=True) as client:
        return call(client)


def _artifacts(flow_run_id: str) -> list:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    return _api(lambda c: c.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))))


def _state(flow_run_id: str) -> str:
    return _api(lambda c: c.read_flow_run(flow_run_id)).state.type.value


@pytest.fixture(scope="module")
def home(services, tmp_path_factory):
    return tmp_path_factory.mktemp("ui-home")


@pytest.fixture(scope="module")
def evolved(services, home):
    """A real cold-start CPU evolve run of two generations, recorded under ``home``/warehouse."""
    from flows.evolve import evolve_flow
    evolve_flow(problem="gemm_bf16", shape_set="gemm_small", run_id=RUN_ID, generations=2, population=4, seed=3,
                cold=True,
                warehouse_root=str(home / "warehouse"), cache_dir=str(services["home"] / "cache"))
    row = Warehouse(home / "warehouse").query("select flow_run_id from runs_latest where run_id = ?",
                                             [RUN_ID]).to_pylist()
    return row[0]["flow_run_id"]


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium binary (chromium / chromium-browser on PATH or /usr/bin/chromium): "
                    "install Debian's `chromium` (apt-get install -y chromium) to run the browser checks")
    from playwright.sync_api import sync_playwright
    import tempfile
    profile = tempfile.mkdtemp(prefix="cake-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=exe, headless=True, args=CHROMIUM_ARGS,
                                                   viewport={"width": 1400, "height": 1000})
        ctx.set_default_timeout(WAIT_MS)
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser):
    pg = browser.new_page()
    yield pg
    pg.close()


def _shot(page, name: str) -> None:
    folder = os.environ.get("CAKE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def _open_run(page, services, flow_run_id: str, tab: str | None = None, shows: str | None = None) -> None:
    """Open the run's page (on ``tab``); with ``shows``, until that text is on it. The UI asks the API once per
    page: an answer lost on a loaded machine leaves the tab empty for good, so the page is opened again (three
    times at most) rather than waited on."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(3):
        page.goto(f"{services['api_url'].removesuffix('/api')}/runs/flow-run/{flow_run_id}")
        if tab:
            page.locator(f"li.p-tab#{tab}").click()
        if shows is None:
            return
        try:
            page.get_by_text(shows, exact=True).first.wait_for(timeout=WAIT_MS // 2)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise


# ---------------------------------------------------------------- the run: names and artifacts


def test_the_run_and_its_tasks_are_named_and_each_generation_publishes_its_table(evolved):
    fr = _api(lambda c: c.read_flow_run(evolved))
    assert fr.name == f"gemm_bf16 · gemm_small · harness v0 · cold · {RUN_ID}"
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    tasks = _api(lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))))
    names = {t.name for t in tasks}
    assert {"artifacts g0", "artifacts g1"} <= names and "artifacts g2" not in names, sorted(names)
    assert any(n.startswith("generate g0 (") and n.endswith(" asked)") for n in names), sorted(names)
    assert any(n.startswith("verify g1 (") and n.endswith(" candidates)") for n in names), sorted(names)
    arts = {a.key: a for a in _artifacts(evolved) if a.key}
    assert {f"{RUN_ID}-generation", f"{RUN_ID}-shapes", f"{RUN_ID}-leaderboard", f"{RUN_ID}-leaderboard-table"} <= \
        set(arts), sorted(arts)
    gens = sorted(a.description for a in _artifacts(evolved) if a.key == f"{RUN_ID}-generation")
    assert gens == [f"run {RUN_ID}, generation {g}" for g in range(2)]
    board = arts[f"{RUN_ID}-leaderboard"].data
    assert f"# Leaderboard of run {RUN_ID}" in board and "| run best |" in board and "hand-written" in board


def test_the_run_page_shows_its_artifacts(evolved, services, page):
    _open_run(page, services, evolved, tab="artifacts", shows=f"{RUN_ID}-generation")
    for key in ("generation", "shapes", "leaderboard", "leaderboard-table"):
        page.get_by_text(f"{RUN_ID}-{key}", exact=True).first.wait_for()
    _shot(page, "ui-run-artifacts")
    page.get_by_text(f"{RUN_ID}-leaderboard", exact=True).first.click()
    page.get_by_role("heading", name=f"Leaderboard of run {RUN_ID}").wait_for()
    page.get_by_text("The best kernel").wait_for()
    _shot(page, "ui-leaderboard")


def test_cake_report_is_published_on_the_run_and_shows_its_figures(evolved, services, home, page):
    exe = Path(sys.executable).parent / "cake"
    env = {**os.environ, "CAKE_PREFECT_API_URL": services["api_url"], "CAKE_HOME": str(home)}
    out = subprocess.run([str(exe), "report", RUN_ID], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr + out.stdout
    assert f"published as artifact `{RUN_ID}-report`" in out.stdout
    report = home / "reports" / RUN_ID
    assert (report / "report.md").exists() and (report / "best_over_generations.png").exists()
    art = [a for a in _artifacts(evolved) if a.key == f"{RUN_ID}-report"]
    assert len(art) == 1 and art[0].data.count("data:image/png;base64,") >= 2
    _open_run(page, services, evolved, tab="artifacts", shows=f"{RUN_ID}-report")
    page.get_by_text(f"{RUN_ID}-report", exact=True).first.click()
    page.get_by_role("heading", name=f"Report of run {RUN_ID}").wait_for()
    imgs = page.locator("img[src^='data:image/png;base64,']")
    imgs.first.wait_for()
    assert imgs.count() == art[0].data.count("data:image/png;base64,")
    _shot(page, "ui-report")
    if folder := os.environ.get("CAKE_SCREENSHOTS"):
        for png in report.glob("*.png"):
            shutil.copy(png, Path(folder) / f"report-{png.name}")


# ---------------------------------------------------------------- a paused proposal


def test_a_paused_proposal_shows_its_evidence_and_the_form_records_the_decision(services, page, tmp_path,
                                                                              share_compile_cache,
                                                                              corpus_gate_store):
    from harness_runs import replay_measurements
    from flows.harness import decide_proposal, harness_review_flow

    root = tmp_path / "warehouse"
    share_compile_cache(tmp_path)                   # the session's corpus gate store
    assert replay_measurements(root) >= 60          # H200 measurements of the corpus: proposals to review
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("out", harness_review_flow(
        warehouse_root=str(root), min_support=3, pause_timeout_s=900, pause_poll_s=1)), daemon=True)
    t.start()
    wh = Warehouse(root)
    pending = lambda: wh.query("select * from proposals_latest where status = 'pending'").to_pylist()  # noqa: E731
    first = _until("the review recorded no proposal", pending)[0]
    flow_run_id = first["flow_run_id"]
    _until("the review did not pause", lambda: _state(flow_run_id) == "PAUSED")
    pid = first["proposal_id"]

    _open_run(page, services, flow_run_id)
    page.get_by_role("button", name="Resume").click()
    modal = page.locator(".p-modal")
    modal.get_by_role("heading", name=f"Proposal {pid}: {first['title']}").wait_for()
    for heading in ("Definition", "Cluster", "Corpus gate: passed"):
        modal.get_by_role("heading", name=heading, exact=True).wait_for()
    assert modal.get_by_role("heading", name="Examples").count() == (1 if json.loads(first["evidence"]).get(
        "examples") else 0)
    page.set_viewport_size({"width": 1400, "height": 2600})     # the whole form in the screenshot
    _shot(page, "ui-paused-proposal")
    page.set_viewport_size({"width": 1400, "height": 1000})

    # untouched: the form refuses, nothing is decided, the run stays paused
    modal.get_by_role("button", name="Submit").click()
    modal.get_by_text("'decision' is a required property").wait_for()
    modal.get_by_text("'reason' is a required property").wait_for()
    assert _state(flow_run_id) == "PAUSED" and pending()[0]["proposal_id"] == pid

    reason = "its composite op shortens every TMA ring it was found in"
    modal.locator(".schema-form-property", has_text="Decision").locator("button.p-select-button__control").focus()
    page.keyboard.press("ArrowDown")
    page.get_by_role("option", name="approve", exact=True).click()
    modal.locator(".schema-form-property", has_text="Reason").locator("textarea").fill(reason)
    modal.get_by_role("button", name="Submit").click()
    modal.wait_for(state="detached")

    decided = _until("the resumed flow did not record the decision", lambda: wh.query(
        "select decision, reason, decided_by, new_version from decisions where proposal_id = ?", [pid]).to_pylist())
    assert decided == [{"decision": "approved", "reason": reason, "decided_by": "prefect-ui", "new_version": 1}]
    def the_rest_decided() -> bool:     # through the CLI's path, so the review ends
        left = [p for p in pending() if p["proposal_id"] != pid]
        if left and _state(flow_run_id) == "PAUSED":
            # in a thread of its own: this one's event loop is Playwright's
            th = threading.Thread(target=decide_proposal, args=(left[0]["proposal_id"], False, "not needed here",
                                                                "test", str(root)))
            th.start()
            th.join()
        return not t.is_alive()
    _until("the review did not end", the_rest_decided, 600)
    out = result["out"]
    assert out[0] == {"proposal_id": pid, "kind": first["kind"], "decision": "approved", "new_version": 1}
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    approved = f"proposal {pid} approved by prefect-ui: {reason}; harness version 1 created"
    _until("the approval's log line did not reach the Prefect API", lambda: any(approved in lg.message for lg in _api(
        lambda c: c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))))))
    keys = {a.key for a in _artifacts(flow_run_id)}
    assert {f"proposal-{pid}", f"decision-{pid}"} <= keys, keys
    _open_run(page, services, flow_run_id, tab="artifacts", shows=f"decision-{pid}")
    _shot(page, "ui-review-decided")
