"""A key-less Pipecat bot written for Twilio Media Streams, served on loopback for the websocket provider's test.

``python tests/e2e/pipecat_bot.py --port P --greeting WAV --log FILE`` serves ``ws://127.0.0.1:P/ws`` with
FastAPI + uvicorn, Pipecat's ``parse_telephony_websocket``, ``TwilioFrameSerializer`` (``auto_hang_up=False``: no
Twilio credentials) and ``FastAPIWebsocketTransport``, in an 8 kHz pipeline (the rate Twilio bots run at). Its
script, per call:

1. plays the greeting WAV through the pipeline (Pipecat paces it), then sends the mark ``greeting-done``;
2. when that mark comes back, sends a 6 s 440 Hz tone as ONE media message, faster than real time as many
   Twilio samples do, then the mark ``tone-done``;
3. 1.5 s later interrupts itself (Pipecat's interruption: a Twilio ``clear``);
4. 0.5 s after that ends the call (EndTaskFrame: Pipecat sends its trailing silence and closes with 1000).

Every message it sends or receives that matters is written to ``--log`` as a JSON line with ``time.monotonic()``
(one clock for every process on the machine), so the test can line it up with what the caller recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, WebSocket
from pipecat.frames.frames import (
    ClientConnectedFrame,
    EndTaskFrame,
    Frame,
    InputDTMFFrame,
    OutputAudioRawFrame,
    OutputTransportMessageFrame,
    OutputTransportMessageUrgentFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

from telcodecs.g711 import ulaw_encode

RATE = 8000
TONE_S = 6.0
CLEAR_AFTER_S = 1.5
END_AFTER_S = 0.5


class Log:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")


def ulaw_tone(seconds: float, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return ulaw_encode((0.3 * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16))


class LoggingSerializer(TwilioFrameSerializer):
    """Twilio's serializer as is; it only notes what passes (Pipecat drops ``mark`` echoes on input)."""

    def __init__(self, log: Log, on_mark: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._log = log
        self._on_mark = on_mark

    async def serialize(self, frame: Frame) -> str | bytes | None:
        out = await super().serialize(frame)
        if isinstance(out, str):
            message = json.loads(out)
            event = message.get("event")
            if event == "media":
                self._log.write("sent_media", bytes=len(base64.b64decode(message["media"]["payload"])))
            elif event in ("mark", "clear"):
                self._log.write(f"sent_{event}", name=(message.get("mark") or {}).get("name", ""))
        return out

    async def deserialize(self, data: str | bytes) -> Frame | None:
        message = json.loads(data)
        if message.get("event") == "mark":
            name = message["mark"]["name"]
            self._log.write("mark_echo", name=name)
            await self._on_mark(name)
        elif message.get("event") in ("start", "stop", "dtmf"):
            self._log.write(f"got_{message['event']}", message=message)
        return await super().deserialize(data)


class Script(FrameProcessor):
    def __init__(self, log: Log, greeting: bytes, stream_sid: str) -> None:
        super().__init__()
        self._log = log
        self._greeting = greeting
        self._sid = stream_sid
        self._tasks: list[asyncio.Task[None]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ClientConnectedFrame):
            self._log.write("greeting", seconds=len(self._greeting) / 2 / RATE)
            await self.push_frame(OutputAudioRawFrame(audio=self._greeting, sample_rate=RATE, num_channels=1))
            await self.push_frame(self._mark("greeting-done"))
        elif isinstance(frame, InputDTMFFrame):
            self._log.write("dtmf", digit=str(frame.button.value))
        await self.push_frame(frame, direction)

    def _mark(self, name: str) -> OutputTransportMessageFrame:
        return OutputTransportMessageFrame(message={"event": "mark", "streamSid": self._sid, "mark": {"name": name}})

    async def mark_came_back(self, name: str) -> None:
        if name == "greeting-done":
            self._tasks.append(asyncio.create_task(self._tone_then_clear_then_end(), name="script"))

    async def _tone_then_clear_then_end(self) -> None:
        tone = base64.b64encode(ulaw_tone(TONE_S)).decode()
        self._log.write("tone", seconds=TONE_S)
        media = {"event": "media", "streamSid": self._sid, "media": {"payload": tone}}
        await self.push_frame(OutputTransportMessageUrgentFrame(message=media))
        mark = {"event": "mark", "streamSid": self._sid, "mark": {"name": "tone-done"}}
        await self.push_frame(OutputTransportMessageUrgentFrame(message=mark))
        await asyncio.sleep(CLEAR_AFTER_S)  # the bot's script: interrupt itself mid-tone
        self._log.write("interrupt")
        await self.broadcast_interruption()
        await asyncio.sleep(END_AFTER_S)
        self._log.write("end")
        await self.push_frame(EndTaskFrame(), FrameDirection.UPSTREAM)


def make_app(greeting: bytes, log: Log) -> FastAPI:
    app = FastAPI()

    @app.websocket("/ws")
    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        _, call = await parse_telephony_websocket(websocket)
        log.write("call", stream_id=call["stream_id"], call_id=call["call_id"], body=call.get("body") or {})
        script = Script(log, greeting, call["stream_id"])
        serializer = LoggingSerializer(
            log,
            script.mark_came_back,
            stream_sid=call["stream_id"],
            call_sid=call["call_id"],
            params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
        )
        transport = FastAPIWebsocketTransport(
            websocket,
            FastAPIWebsocketParams(
                audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False, serializer=serializer
            ),
        )
        task = PipelineTask(
            Pipeline([transport.input(), script, transport.output()]),
            params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        )

        @transport.event_handler("on_client_disconnected")
        async def _gone(_transport: Any, _client: Any) -> None:
            log.write("disconnected")
            await task.cancel()

        await PipelineRunner(handle_sigint=False).run(task)
        log.write("pipeline_done")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--greeting", type=Path, required=True, help="8 kHz mono PCM16 WAV")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    with wave.open(str(args.greeting), "rb") as wav:
        if wav.getframerate() != RATE or wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise SystemExit("the greeting must be 8 kHz mono PCM16")
        greeting = wav.readframes(wav.getnframes())
    log = Log(args.log)
    print(f"pipecat bot on ws://127.0.0.1:{args.port}/ws", flush=True)
    uvicorn.run(make_app(greeting, log), host="127.0.0.1", port=args.port, log_level="info")


if __name__ == "__main__":
    main()
