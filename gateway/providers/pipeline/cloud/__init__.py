"""Cloud speech components of the pipeline: Deepgram and OpenAI STT; ElevenLabs, Cartesia and OpenAI TTS.

Each module is a sans-I/O core (URL and message builders, a parser returning port events, word timing) and a thin
async shell over one websocket (:mod:`._socket`) or one HTTP stream (httpx), behind the ports of
:mod:`gateway.providers.pipeline.ports`.
"""
