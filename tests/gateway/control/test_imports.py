"""The control plane starts without the media stack: no codecs, resamplers or provider clients are loaded
(they cost seconds of start-up under load and the control plane never touches audio)."""

import subprocess
import sys

HEAVY = ("scipy", "av", "aiortc", "gateway.providers.gemini", "gateway.providers.openai", "telcodecs.resample")


def test_control_plane_imports_no_media_stack() -> None:
    code = "import sys, gateway.control.app; print(' '.join(sorted(m for m in sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
