"""Cloud speech components of the pipeline: Deepgram and OpenAI STT; ElevenLabs, Cartesia and OpenAI TTS.

Each module is a sans-I/O core (URL and message builders, a parser returning port events, word timing) and a thin
async shell over one websocket (:mod:`._socket`) or one HTTP stream (httpx), behind the ports of
:mod:`gateway.providers.pipeline.ports`. Importing this package registers the components by name
(:mod:`.factories`) with the pipeline's registry when the registry is part of this install.
"""

from __future__ import annotations

import importlib
import importlib.util


def _register() -> None:
    # The registry (gateway.providers.pipeline.components) imports this package to load its plugins; looking it
    # up here instead of importing it keeps the adapters usable on their own (tests, the bench).
    if importlib.util.find_spec("gateway.providers.pipeline.components") is None:
        return
    components = importlib.import_module("gateway.providers.pipeline.components")
    factories = importlib.import_module("gateway.providers.pipeline.cloud.factories")
    factories.register_all(components.register)


_register()
