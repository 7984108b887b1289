"""BLAS runs on one thread in the tests and in every process they start (Ray workers, `cake` subprocesses):
the interpreter's products are small (a 128x64 tile by a 64x128 one), and OpenBLAS's threads spinning
against each other on a busy 2-core machine made one of them cost 1-15 ms instead of 0.04 ms.
"""
import os
import sys
import warnings

if "numpy" in sys.modules:   # too late for the variable to take effect here: say so rather than run slow
    warnings.warn("numpy was imported before tests/conftest.py could run BLAS on one thread; "
                  "set OPENBLAS_NUM_THREADS=1 for this run", stacklevel=1)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
