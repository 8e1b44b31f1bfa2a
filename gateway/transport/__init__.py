"""Transport: the only owners of sockets (SIP UDP/TCP glue, RTP port pool, aiortc glue)."""
