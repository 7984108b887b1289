"""The `cake` command line.

BLAS runs on one thread in `cake` and every process it starts (Ray workers, a deployment's flow runs):
Cake's parallelism is across processes (the compile pool, the runners), and the CPU interpreter's products
are small tiles (a 128x64 by a 64x128), which OpenBLAS's threads spinning against each other on a busy
machine made cost 1-15 ms instead of 0.04 ms. Set OPENBLAS_NUM_THREADS to choose otherwise.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
