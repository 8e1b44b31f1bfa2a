"""Media worker: glues SIP signalling, RTP media, the tick and call sessions into one process part."""
