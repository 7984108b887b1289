"""The four miners, each turning warehouse records into at most one proposal with its evidence.

- :func:`~cake_core.harness.miners.rule.mine_rule`: a learned verifier rule for a failure cluster;
- :func:`~cake_core.harness.miners.primitive.mine_primitive`: a composite op from winners' op patterns;
- :func:`~cake_core.harness.miners.calibration.mine_calibration`: a cost-model refit;
- :func:`~cake_core.harness.miners.tactic.mine_tactic`: a macro tactic from winning tactic sequences.

Each returns ``(proposal, {})`` or ``(None, why)``: a review reports what it did not propose and why.
"""
from cake_core.harness.miners.calibration import mine_calibration
from cake_core.harness.miners.primitive import mine_primitive
from cake_core.harness.miners.rule import mine_rule
from cake_core.harness.miners.tactic import mine_tactic

__all__ = ["mine_calibration", "mine_primitive", "mine_rule", "mine_tactic"]
