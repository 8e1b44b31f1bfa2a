"""telcodecs: pure, synchronous telephony DSP (imported as ``telcodecs``; the folder is ``codecs/``).

The stdlib owns the import name ``codecs``; this package is mapped to ``telcodecs`` in pyproject.toml.
It imports nothing from ``gateway`` and does no I/O: no asyncio, sockets, clocks or environment.
"""
