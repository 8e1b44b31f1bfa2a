"""The cascaded agent: speech-to-text -> chat model -> text-to-speech behind one RealtimeSession.

Ports (what each component must offer) live in :mod:`.ports`; each adapter is a sans-I/O core plus a thin
I/O shell. The session core sees the pipeline as one more provider and needs no special case.
"""
