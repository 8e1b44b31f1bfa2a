"""Suite-wide fixtures. Peer helpers live in tests/support."""
