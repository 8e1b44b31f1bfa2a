"""Session core: one CallSession per call between the media leg and a realtime provider."""
