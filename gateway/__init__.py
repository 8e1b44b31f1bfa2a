"""Telephony gateway for realtime AI voice agents.

Layers (imports point downward only; see docs/architecture.md):
control | worker -> session -> providers | transport -> sip | media -> telcodecs.
"""

__version__ = "0.1.0"

import os as _os

# The media tick runs small matrix products every 20 ms; a multithreaded BLAS turns each into a thread
# hand-off that costs far more than the arithmetic (docs/performance/2026-11-30-what-was-optimized.md). This only
# takes effect when numpy has not been imported yet, which is the case for every `gateway` process entry point.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

# GATEWAY_COMPILED=DIR: the media plane's hot modules from a mypyc build (`gateway compile --out DIR`), checked
# against these sources; see gateway/compiled/__init__.py. It must act before any of those modules is imported.
if _os.environ.get("GATEWAY_COMPILED"):
    from gateway.compiled import enable as _enable_compiled

    _enable_compiled(_os.environ["GATEWAY_COMPILED"])
