"""Telephony gateway for realtime AI voice agents.

Layers (imports point downward only; see docs/architecture.md):
control | worker -> session -> providers | transport -> sip | media -> telcodecs.
"""

__version__ = "0.1.0"
