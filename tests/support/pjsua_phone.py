"""A PJSIP (pjsua2) SIP phone as a standalone helper process, driven by its command line.

Run by tests/support/pjsua.py as a subprocess, because pjsua2 can abort the whole process when Python
objects of a finished call are torn down: this helper ends with `ep.libDestroy()` (which also finalizes the
recorded WAV header) and `os._exit`.

Caller mode dials `--uri`; callee mode answers the first incoming call with 200. During the call it plays
`--play` into the call (WAV, no loop), records what it hears to `--record`, sends RFC 4733 DTMF digits at
the given times after the call is confirmed (`--dtmf 1@0.5,2@0.8`), puts the call on hold and takes it off
(`--hold-at`, `--unhold-at`: re-INVITEs with a=sendonly, then a=sendrecv), answers with 183 and early media
first (`--early-media-s`: the 200 follows that much later; the player and recorder run from the 183), transfers
the far end with REFER (`--xfer-to` at `--xfer-at`; it hangs up once a NOTIFY reports the transfer's 2xx), hangs
up after `--hangup-after` seconds, when the played WAV ends (`--hangup-on-eof`), or at `--max-seconds` at the latest.
With `--follow-transfer` the phone goes on with a new call that takes its call over: a REFER's (it accepts it, as
pjsua does, and calls the Refer-To, Replaces included) or an INVITE with Replaces of its call (pjsua answers it and
ends the replaced one); the player, recorder and timers carry on with the new call, and the old call ending does not
end the run. Reports `xfer_request`, `replaced`.

It reports JSON objects on stdout, one per line, each prefixed with `@@pjsua `:
ready, call_state, media_active, media_state (every media update: status, the direction we were offered),
hold_sent, unhold_sent (with rx_packets: the RTP packets the call's stream had received, as call_state and answered
carry too), dtmf_sent, dtmf_received, player_eof, xfer_sent, xfer_status (each NOTIFY's sipfrag status, or the
REFER's refusal: code, reason, final), done. PJSIP's own log goes to
`--log`. Everything listens on 127.0.0.1 only; a null sound device keeps it off the audio hardware.

SIP over TLS: `--tls-port` adds PJSIP's TLS transport there (`--tls-cert`/`--tls-key` for what it serves,
`--tls-ca` and `--tls-verify-server` for how it checks the server it calls: chain and name); a URI with
`;transport=tls` or `sips:` takes it. `--srtp-secure-signaling 1` makes PJSIP refuse SDES keys over a hop that is
not TLS (call_state and the log say so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import pjsua2 as pj

PREFIX = "@@pjsua "
_started = time.monotonic()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": round(time.monotonic() - _started, 3), **fields})
    sys.stdout.write(PREFIX + line + "\n")
    sys.stdout.flush()


def parse_dtmf_plan(text: str) -> list[tuple[float, str]]:
    """ "1@0.5,2@0.8" -> [(0.5, "1"), (0.8, "2")], sorted by time."""
    plan = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        digits, _, at = item.partition("@")
        plan.append((float(at or 0.0), digits))
    return sorted(plan)


class Player(pj.AudioMediaPlayer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.ended = False

    def onEof2(self) -> None:
        # Runs on the media clock thread: only set a flag, the main loop acts on it.
        self.ended = True


class Phone:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.call: PhoneCall | None = None
        self.confirmed_at: float | None = None
        self.disconnected = False
        self.player: Player | None = None
        self.recorder: pj.AudioMediaRecorder | None = None
        self.eof_reported = False
        self.answer_at: float | None = None  # callee with early media: when the 200 follows the 183
        self.transferred = False  # a NOTIFY reported the transfer's 2xx
        self.account: pj.Account | None = None
        self.calls: list[PhoneCall] = []  # the calls a transfer took over


class PhoneCall(pj.Call):  # type: ignore[misc]
    def __init__(self, phone: Phone, account: pj.Account, call_id: int = pj.PJSUA_INVALID_ID) -> None:
        super().__init__(account, call_id)
        self.phone = phone

    def onCallState(self, prm: pj.OnCallStateParam) -> None:
        info = self.getInfo()
        media = audio_index(self)
        emit(
            "call_state",
            state=info.stateText,
            code=int(info.lastStatusCode),
            reason=info.lastReason,
            rx_packets=rx_packets(self, media),
        )
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED and self.phone.confirmed_at is None:
            self.phone.confirmed_at = time.monotonic()
        if info.state == pj.PJSIP_INV_STATE_DISCONNECTED and self is self.phone.call:
            self.phone.disconnected = True  # a call taken over by a transfer's new one ends without ending the run

    def onCallTransferRequest(self, prm: pj.OnCallTransferRequestParam) -> None:
        emit("xfer_request", to=prm.dstUri, following=self.phone.args.follow_transfer)
        if self.phone.args.follow_transfer:
            self.phone.calls.append(self)  # kept: tearing a pjsua2 Call object down may abort the process
            self.phone.call = prm.newCall = PhoneCall(self.phone, self.phone.account)

    def onCallReplaced(self, prm: pj.OnCallReplacedParam) -> None:
        emit("replaced", new_call=int(prm.newCallId))
        self.phone.calls.append(self)
        self.phone.call = prm.newCall = PhoneCall(self.phone, self.phone.account, prm.newCallId)

    def onCallMediaState(self, prm: pj.OnCallMediaStateParam) -> None:
        info = self.getInfo()
        for index, media in enumerate(info.media):
            if media.type != pj.PJMEDIA_TYPE_AUDIO:
                continue
            emit("media_state", status=int(media.status), dir=int(media.dir), rx_packets=rx_packets(self, index))
            # On hold too: a port left unconnected is not clocked, so the WAV would stop playing (a held phone
            # sends on) and the recording would lose the time of the hold.
            live = (pj.PJSUA_CALL_MEDIA_ACTIVE, pj.PJSUA_CALL_MEDIA_LOCAL_HOLD, pj.PJSUA_CALL_MEDIA_REMOTE_HOLD)
            if media.status not in live:
                continue
            audio = self.getAudioMedia(index)
            stream = self.getStreamInfo(index)
            phone, args = self.phone, self.phone.args
            if media.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                emit("media_active", codec=stream.codecName, clock_rate=int(stream.codecClockRate))
            if args.record and phone.recorder is None:
                phone.recorder = pj.AudioMediaRecorder()
                phone.recorder.createRecorder(args.record)
            if args.play and phone.player is None:
                phone.player = Player()
                phone.player.createPlayer(args.play, pj.PJMEDIA_FILE_NO_LOOP)
            # A re-INVITE may give the call a new conference port: connect again (connecting twice is harmless).
            if phone.recorder is not None:
                audio.startTransmit(phone.recorder)
            if phone.player is not None:
                phone.player.startTransmit(audio)

    def onCallTransferStatus(self, prm: pj.OnCallTransferStatusParam) -> None:
        code, final = int(prm.statusCode), bool(prm.finalNotify)
        emit("xfer_status", code=code, reason=prm.reason, final=final)
        if final and 200 <= code < 300:
            self.phone.transferred = True

    def onDtmfDigit(self, prm: pj.OnDtmfDigitParam) -> None:
        emit("dtmf_received", digit=prm.digit, method=int(prm.method))


def rx_packets(call: pj.Call, index: int) -> int | None:
    """RTP packets the call's audio stream has received (None while it has no stream)."""
    try:
        return int(call.getStreamStat(index).rtcp.rxStat.pkt)
    except pj.Error:
        return None


def audio_index(call: pj.Call) -> int:
    for index, media in enumerate(call.getInfo().media):
        if media.type == pj.PJMEDIA_TYPE_AUDIO:
            return index
    return 0


class PhoneAccount(pj.Account):  # type: ignore[misc]
    def __init__(self, phone: Phone) -> None:
        super().__init__()
        self.phone = phone

    def onIncomingCall(self, prm: pj.OnIncomingCallParam) -> None:
        call = PhoneCall(self.phone, self, prm.callId)
        answer = pj.CallOpParam()
        if self.phone.call is not None:
            answer.statusCode = 486
            call.hangup(answer)
            return
        emit("incoming_call", remote=call.getInfo().remoteUri)
        if self.phone.args.answer_code != 200:  # busy (486), declined (603): refused, and the phone stays free
            answer.statusCode = self.phone.args.answer_code
            call.hangup(answer)
            emit("rejected", status=self.phone.args.answer_code)
            return
        self.phone.call = call
        early = self.phone.args.early_media_s
        answer.statusCode = 183 if early else 200  # 183 carries the SDP answer: early media until the 200
        call.answer(answer)
        if early:
            self.phone.answer_at = time.monotonic() + early


def configure_codecs(ep: pj.Endpoint, wanted: list[str]) -> None:
    """Only the wanted codecs, in that priority order (names like PCMU, PCMA, G722)."""
    available = [c.codecId for c in ep.codecEnum2()]
    for codec_id in available:
        ep.codecSetPriority(codec_id, 0)
    for rank, name in enumerate(wanted):
        matches = [c for c in available if c.upper().startswith(name.upper() + "/")]
        if not matches:
            raise SystemExit(f"codec {name} not available; have {available}")
        for codec_id in matches:
            ep.codecSetPriority(codec_id, 250 - rank)


def run(args: argparse.Namespace) -> int:
    phone = Phone(args)
    ep = pj.Endpoint()
    ep.libCreate()
    cfg = pj.EpConfig()
    # Callbacks run in this thread only, from libHandleEvents in the loop below.
    cfg.uaConfig.threadCnt = 0
    cfg.uaConfig.mainThreadOnly = True
    cfg.uaConfig.userAgent = "vgw-test-pjsua"
    cfg.logConfig.level = 5
    cfg.logConfig.consoleLevel = 0
    cfg.logConfig.filename = args.log or ""
    cfg.medConfig.clockRate = args.clock_rate
    cfg.medConfig.sndClockRate = args.clock_rate
    cfg.medConfig.channelCount = 1
    cfg.medConfig.noVad = True
    cfg.medConfig.ecTailLen = 0
    ep.libInit(cfg)
    ep.audDevManager().setNullDev()

    transport = pj.TransportConfig()
    transport.port = args.port
    transport.boundAddress = args.host
    transport.publicAddress = args.host
    ep.transportCreate(pj.PJSIP_TRANSPORT_UDP, transport)
    if args.tls_port:
        tls = pj.TransportConfig()
        tls.port = args.tls_port
        tls.boundAddress = "127.0.0.1"
        tls.publicAddress = "127.0.0.1"
        tls.tlsConfig.method = pj.PJSIP_TLSV1_2_METHOD
        if args.tls_ca:
            tls.tlsConfig.CaListFile = args.tls_ca
        if args.tls_cert:
            tls.tlsConfig.certFile = args.tls_cert
            tls.tlsConfig.privKeyFile = args.tls_key
        tls.tlsConfig.verifyServer = bool(args.tls_verify_server)
        ep.transportCreate(pj.PJSIP_TRANSPORT_TLS, tls)
    ep.libStart()
    configure_codecs(ep, [c for c in args.codecs.split(",") if c])

    account_cfg = pj.AccountConfig()
    account_cfg.idUri = f"sip:{args.user}@{args.host}:{args.port}"
    if args.display_name:
        account_cfg.idUri = f'"{args.display_name}" <{account_cfg.idUri}>'
    account_cfg.mediaConfig.transportConfig.port = args.rtp_port
    account_cfg.mediaConfig.transportConfig.portRange = 20
    account_cfg.mediaConfig.transportConfig.boundAddress = args.host
    account_cfg.mediaConfig.transportConfig.publicAddress = args.host
    if args.auth_user:
        # Digest credentials for any realm: the gateway's 401 is answered once per call.
        account_cfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", args.auth_user, 0, args.auth_password))
    if args.srtp != "disabled":
        # SDES SRTP (PJMEDIA_SRTP_OPTIONAL: RTP/AVP with a=crypto; MANDATORY: RTP/SAVP). Secure signalling 0: SDES
        # keys are accepted over plain SIP, as the media's only option apart from the transport's.
        account_cfg.mediaConfig.srtpUse = {
            "optional": pj.PJMEDIA_SRTP_OPTIONAL,
            "mandatory": pj.PJMEDIA_SRTP_MANDATORY,
        }[args.srtp]
        account_cfg.mediaConfig.srtpSecureSignaling = args.srtp_secure_signaling
    if args.prack != "off":
        # RFC 3262: "mandatory" puts Require: 100rel in its INVITE (the callee must send 18x reliably; it PRACKs).
        account_cfg.callConfig.prackUse = {
            "optional": pj.PJSUA_100REL_OPTIONAL,
            "mandatory": pj.PJSUA_100REL_MANDATORY,
        }[args.prack]
    account = PhoneAccount(phone)
    account.create(account_cfg)
    phone.account = account
    emit("ready", sip_port=args.port, uri=account_cfg.idUri, mode=args.mode)

    if args.mode == "caller":
        phone.call = PhoneCall(phone, account)
        call_op = pj.CallOpParam(True)
        for line in args.header:
            name, _, value = line.partition(":")
            header = pj.SipHeader()
            header.hName, header.hValue = name.strip(), value.strip()
            call_op.txOption.headers.append(header)
        phone.call.makeCall(args.uri, call_op)

    dtmf_plan = parse_dtmf_plan(args.dtmf)
    hold_plan = sorted(
        [(at, "hold") for at in [args.hold_at] if at is not None]
        + [(at, "unhold") for at in [args.unhold_at] if at is not None]
    )
    deadline = _started + args.max_seconds
    hangup_sent = False
    reason = "disconnected"
    while not phone.disconnected:
        ep.libHandleEvents(10)
        now = time.monotonic()
        call = phone.call
        if call is None or hangup_sent:
            if now >= deadline:
                reason = reason if hangup_sent else "max-seconds"
                break
            continue
        if phone.answer_at is not None and now >= phone.answer_at:
            phone.answer_at = None
            ok = pj.CallOpParam()
            ok.statusCode = 200
            call.answer(ok)
            emit("answered", rx_packets=rx_packets(call, audio_index(call)))
        if phone.player is not None and phone.player.ended and not phone.eof_reported:
            phone.eof_reported = True
            emit("player_eof")
        stop: str | None = None
        if phone.confirmed_at is not None:
            elapsed = now - phone.confirmed_at
            while dtmf_plan and dtmf_plan[0][0] <= elapsed:
                _, digits = dtmf_plan.pop(0)
                send = pj.CallSendDtmfParam()
                send.digits = digits
                send.method = pj.PJSUA_DTMF_METHOD_RFC2833
                call.sendDtmf(send)
                emit("dtmf_sent", digits=digits)
            while hold_plan and hold_plan[0][0] <= elapsed:
                _, what = hold_plan.pop(0)
                received = rx_packets(call, audio_index(call))
                if what == "hold":
                    call.setHold(pj.CallOpParam(True))
                else:
                    unhold = pj.CallOpParam(True)
                    unhold.opt.flag = pj.PJSUA_CALL_UNHOLD
                    call.reinvite(unhold)
                emit(f"{what}_sent", rx_packets=received)
            if args.xfer_to and args.xfer_at is not None and elapsed >= args.xfer_at:
                args.xfer_at = None
                call.xfer(args.xfer_to, pj.CallOpParam(True))
                emit("xfer_sent", to=args.xfer_to)
            if phone.transferred:
                stop = "transferred"
            hang_up_now = (args.hangup_after is not None and elapsed >= args.hangup_after) or (
                args.hangup_on_eof and phone.eof_reported and not dtmf_plan
            )
            if hang_up_now:
                stop = "hangup"
        if now >= deadline:
            stop = "max-seconds"
        if stop is not None:
            reason = stop
            call.hangup(pj.CallOpParam(True))
            hangup_sent = True
            # Keep pumping events until DISCONNECTED (or a short grace) so the BYE goes out.
            deadline = now + 3.0
    emit("call_ended", reason=reason)
    ep.hangupAllCalls()
    for _ in range(20):
        ep.libHandleEvents(10)
    ep.libDestroy()
    emit("done", recording=args.record or None)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("caller", "callee"), required=True)
    parser.add_argument("--uri", help="SIP URI to dial (caller mode)")
    parser.add_argument("--user", default="pjsua")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address SIP and RTP bind to")
    parser.add_argument("--auth-user", default="", help="digest username answering a 401")
    parser.add_argument("--auth-password", default="")
    parser.add_argument("--display-name", default="", help="the display name of its From")
    parser.add_argument("--header", action="append", default=[], help="NAME: VALUE added to the INVITE (repeatable)")
    parser.add_argument("--port", type=int, required=True, help="SIP UDP port on 127.0.0.1")
    parser.add_argument("--rtp-port", type=int, required=True, help="first RTP port on 127.0.0.1")
    parser.add_argument("--answer-code", type=int, default=200, help="callee: answer 200, or refuse with this")
    parser.add_argument("--play", help="WAV played into the call")
    parser.add_argument("--record", help="WAV recording what the phone hears")
    parser.add_argument("--dtmf", default="", help="DIGITS@SECONDS_AFTER_CONFIRMED,...")
    parser.add_argument("--hangup-after", type=float, help="seconds after the call is confirmed")
    parser.add_argument("--hold-at", type=float, help="put the call on hold this many seconds after it is confirmed")
    parser.add_argument("--unhold-at", type=float, help="take it off hold this many seconds after it is confirmed")
    parser.add_argument("--xfer-to", help="transfer the call there with REFER (RFC 3515)")
    parser.add_argument("--xfer-at", type=float, help="this many seconds after the call is confirmed")
    parser.add_argument(
        "--follow-transfer", action="store_true", help="take a REFER's new call, or an INVITE with Replaces"
    )
    parser.add_argument("--hangup-on-eof", action="store_true", help="hang up when the played WAV ends")
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument(
        "--early-media-s", type=float, default=0.0, help="callee: 183 with SDP, the 200 this much later"
    )
    parser.add_argument("--codecs", default="PCMU,PCMA")
    parser.add_argument("--clock-rate", type=int, default=8000)
    parser.add_argument("--log", help="PJSIP log file")
    parser.add_argument("--srtp", choices=["disabled", "optional", "mandatory"], default="disabled")
    parser.add_argument(
        "--prack", choices=["off", "optional", "mandatory"], default="off", help="100rel: Supported / Require"
    )
    parser.add_argument(
        "--srtp-secure-signaling", type=int, choices=[0, 1, 2], default=0, help="1: SDES only over TLS signalling"
    )
    parser.add_argument("--tls-port", type=int, help="also speak SIP over TLS on this 127.0.0.1 port")
    parser.add_argument("--tls-ca", help="CA list (PEM) the server's certificate is checked against")
    parser.add_argument("--tls-cert", help="certificate (PEM) its TLS transport serves")
    parser.add_argument("--tls-key", help="private key (PEM) of --tls-cert")
    parser.add_argument("--tls-verify-server", action="store_true", help="refuse a server it cannot verify")
    args = parser.parse_args(argv)
    if args.mode == "caller" and not args.uri:
        parser.error("--uri is required in caller mode")
    try:
        code = run(args)
    except Exception as error:  # report, then leave without running pjsua2 destructors
        emit("error", message=f"{type(error).__name__}: {error}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
