from tests.support.fixtures import peer_procs, speech_8k, speech_48k_stereo  # noqa: F401
