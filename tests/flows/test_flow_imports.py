"""flows/ only orchestrate: they import Prefect, `tasks` and the standard library, nothing else."""
import ast
import sys
from pathlib import Path

FLOWS = Path(__file__).resolve().parents[2] / "flows"
ALLOWED = {"prefect", "tasks", "flows", "__future__"}   # a flow may run another as a subflow


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):      # function-level imports count too
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def test_flows_import_only_prefect_tasks_and_the_standard_library():
    files = sorted(FLOWS.glob("*.py"))
    assert {f.name for f in files} >= {"evolve.py", "harness.py"}
    for f in files:
        bad = {m for m in _imports(f) if m not in ALLOWED and m not in sys.stdlib_module_names}
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_the_check_catches_a_forbidden_import(tmp_path):
    f = tmp_path / "bad_flow.py"
    f.write_text("import os\nfrom prefect import flow\n\ndef go():\n    import ray\n    from cake_core import x\n")
    assert {m for m in _imports(f) if m not in ALLOWED and m not in sys.stdlib_module_names} == {"ray", "cake_core"}
