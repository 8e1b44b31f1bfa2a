"""Realtime providers: OpenAI Realtime (GA), Gemini Live, the local echo agent, and a fake server."""
