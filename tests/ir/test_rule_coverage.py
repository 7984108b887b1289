"""Every registered verifier rule is named by at least one test (each family's tests plant its failure)."""
from pathlib import Path

from cake_core.ir.verify import RULES

TESTS = "".join(p.read_text() for p in (Path(__file__).parent).glob("test_*.py") if p.name != Path(__file__).name)


def test_at_least_25_rules():
    assert len(RULES) >= 25


def test_every_rule_is_planted_by_a_test():
    missing = [r for r in RULES if f'"{r}"' not in TESTS]
    assert not missing, f"rules without a planted failing program: {missing}"
