"""Bring your own bot: the ``websocket`` provider and its Twilio-Media-Streams-compatible protocol.

:mod:`.protocol` (sans-I/O messages both ways), :mod:`.audio` (wire <-> session audio), :mod:`.ledger` (marks and
how far the bot is ahead), :mod:`.session` (the I/O shell: :class:`~.session.WebsocketBotModel`), :mod:`.fake_bot` (a
small bot server for tests and the bench). The protocol is documented in docs/operations.md, "Websocket provider
(bring your own bot)".
"""
