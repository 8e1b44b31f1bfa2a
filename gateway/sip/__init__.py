"""SIP: sans-I/O RFC 3261 parser, transactions, dialogs, SDP offer/answer and digest auth."""
