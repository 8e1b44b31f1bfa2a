"""Synthetic-RTP SIP load generator (`gateway loadtest`)."""
