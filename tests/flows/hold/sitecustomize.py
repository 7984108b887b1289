"""Loaded only by the subprocess that ``test_resume`` kills: once the run has landed an attempt of generation
``CAKE_TEST_HOLD_GENERATION`` (after a whole earlier generation), it writes the file ``CAKE_TEST_HOLD_FILE`` and
stops there for good, so the test kills it in the middle of a generation without racing it."""
import os
import sys
import time

_FILE, _GEN = os.environ.get("CAKE_TEST_HOLD_FILE"), os.environ.get("CAKE_TEST_HOLD_GENERATION")

if _FILE and _GEN and os.path.basename(sys.argv[0] if sys.argv else "") == "cake":
    import tasks.record as _record

    _attempts = _record.Recorder.attempts

    def _attempts_then_hold(self, attempts):
        n = _attempts(self, attempts)
        if any(a.generation >= int(_GEN) for a in attempts):
            self.flush()                              # what it handed over has landed
            with open(_FILE, "w") as f:
                f.write(",".join(sorted({str(a.generation) for a in attempts})))
            while True:                               # the kill comes here
                time.sleep(60)
        return n

    _record.Recorder.attempts = _attempts_then_hold
