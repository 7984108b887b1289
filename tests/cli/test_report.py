"""`cake report RUN`: figures and Markdown from a known warehouse; a run without measurements says what it lacks;
an unknown run is one line. Publishing to a live server is checked by tests/flows/test_browser.py."""
import sys
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))

from ui_rows import SHAPES, fill  # noqa: E402

from cake_cli.main import app  # noqa: E402
from cake_cli.report import build_report, inline_figures  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _cake(*args):
    return CliRunner().invoke(app, list(args))


def test_report_writes_four_figures_and_the_tables(tmp_path):
    fill(tmp_path / "home" / "warehouse")
    out = tmp_path / "rep"
    result = _cake("report", "run-a", "--out", str(out), "--no-publish")
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'report.md'} and 4 figures" in result.stdout
    names = ["best_over_generations", "speedup_per_shape", "failure_clusters", "predicted_vs_measured"]
    for n in names:
        png = (out / f"{n}.png").read_bytes()
        assert png.startswith(PNG) and len(png) > 10_000, n          # a drawn figure, not an empty canvas
    md = (out / "report.md").read_text()
    assert "kmeans_assign on `kmeans_portfolio`, harness v1" in md and "GPU H200" in md
    assert all(f"]({n}.png)" in md for n in names) and "Not drawn" not in md
    assert "## Leaderboard of run run-a" in md and "| 2 | run-a-att-14 | run best | measured | 0.3333 |" in md
    assert f"| {SHAPES[0]} | headline | 0.3333 | measured | kmeans_assign_ws.cake | 0.3 | 0.90× | flash_kmeans | 0.8 | 2.40× |" in md
    inlined = inline_figures(md, out)
    assert inlined.count("](data:image/png;base64,iVBORw0KGgo") == 4 and ".png)" not in inlined


def test_a_run_without_measurements_is_reported_with_what_it_lacks(tmp_path):
    from warehouse import Warehouse
    wh = fill(tmp_path / "wh")
    # run-b's rows without its measurements: a run checked on the CPU, ranked by the model, never timed
    rows = wh.query("select * from attempts where run_id = 'run-b'").to_pylist()
    other = Warehouse(tmp_path / "cpu")
    other.append("runs", [dict(r, gpu_model=None) for r in wh.query(
        "select * exclude (recorded_at) from runs where run_id = 'run-b'").to_pylist()])
    other.append("attempts", [dict(r, outcome="checked" if r["outcome"] == "measured" else r["outcome"])
                              for r in rows])
    path, drawn = build_report(str(tmp_path / "cpu"), "run-b", tmp_path / "out")
    assert drawn["best_over_generations"] and drawn["failure_clusters"]
    assert drawn["predicted_vs_measured"] is None and drawn["speedup_per_shape"] is None
    md = path.read_text()
    assert "no GPU (checked on the interpreter, not timed)" in md
    assert "Not drawn: nothing was measured (a run without a GPU is checked, not timed)." in md
    assert "Not drawn: no hand-written kernel or peer was scored on the run's shapes." in md
    assert not (tmp_path / "out" / "predicted_vs_measured.png").exists()


def test_an_unknown_run_is_one_line(tmp_path):
    fill(tmp_path / "home" / "warehouse")
    result = _cake("report", "nope", "--no-publish")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no run `nope` in ") and "runs_latest" in lines[0]


def test_no_warehouse_is_one_line(tmp_path):
    result = _cake("report", "run-a", "--no-publish")
    assert result.exit_code == 2 and result.stderr.startswith("error: no warehouse at ")


def test_an_unreachable_server_is_one_line_and_the_files_stay(tmp_path, free_port, monkeypatch):
    fill(tmp_path / "home" / "warehouse")
    monkeypatch.setenv("CAKE_PREFECT_API_URL", f"http://127.0.0.1:{free_port()}/api")
    result = _cake("report", "run-a")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "127.0.0.1" in lines[0]
    assert "wrote " in result.stdout and (tmp_path / "home" / "reports" / "run-a" / "report.md").exists()
