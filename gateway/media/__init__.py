"""Media: sans-I/O RTP/RTCP, jitter buffer, RFC 4733 DTMF, and the shared 20 ms media tick."""
