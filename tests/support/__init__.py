"""The real-peer test harness: third-party SIP phones, a SIP load balancer, redis and a browser, all on
127.0.0.1, all bounded in time and stopped by PID.

Modules (import as `tests.support.<module>`):

- procs     `ProcessGroup` (owns processes: `start(name, argv, lifetime=...)`, `aclose()`),
            `ManagedProcess` (`wait_for_output(regex, within=)`, `wait_for_port(port, within=, kind=)`,
            `wait(within=)`, `terminate()`, `log_path`), `free_ports(n)` (consecutive UDP+TCP-free ports).
- audio     `speech_wav(text, path, rate, channels)` (espeak-ng + sox, cached), `read_wav`/`write_wav`,
            `align_and_correlate(sent, received, rate) -> (correlation, lag)`, `rms_dbfs`, `chirp_marker`,
            `resample`, `with_silence`.
- baresip   `BaresipPhone` (caller, or `auto_answer=True` callee; PCMU/PCMA/Opus; ctrl_tcp: `dial`,
            `send_dtmf`, `hangup`, `wait_established/closed/dtmf`; `last_recording().decoded`).
- pjsua     `PjsuaPhone` (pjsua2 in a helper process; caller or callee; play/record WAV; RFC 4733 DTMF at
            given times, telephone-event PT 120; `wait_state("CONFIRMED")`, `wait_done`, `recording`).
- kamailio  `KamailioDispatcher` (deploy/kamailio/dispatcher.cfg with per-instance defines;
            `check_config()`, `dispatcher_list()`, `wait_target(uri, active=)`, `sip_uri(user)`);
            `KamailioRegistrar` (kamailio-registrar.cfg: registrar + digest auth for one account, UDP and
            TCP; `bindings(aor_user)` from `kamcmd ul.dump`, `wait_bindings(aor_user, predicate, within=)`).
- redis     `RedisServer` (`url`), no persistence.
- chromium  `launch_chromium(workdir, fake_audio_wav=...)` -> session with a Playwright `context`;
            `LoopbackHttpServer({"/": html})`.
- netns     `require_netns()`, `run_in_netns(argv)`, `start_in_netns(procs, name, argv, lifetime=)`,
            `python_call_argv(func, *args)`: private network namespace with only loopback.
- peers     `require_binary(name)`, `require_module(name)`: skip locally, fail under CI=true.
- fixtures  `peer_procs` (a ProcessGroup whose logs are listed when a test fails), `speech_8k`,
            `speech_48k_stereo`; import them into your conftest.

Calling a gateway from a test (the gateway listens on 127.0.0.1:GW_PORT; mark the test
`@pytest.mark.peer` and give it a `pytest.mark.timeout`):

    from tests.support.fixtures import peer_procs, speech_8k  # in conftest.py, noqa: F401

    async def test_echo_agent_answers(peer_procs, tmp_path, speech_8k):
        require_binary("baresip", package="baresip baresip-core")
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=5)
        async with phone:
            await phone.dial(f"sip:agent@127.0.0.1:{GW_PORT}")
            await phone.wait_established(within=10)
            await phone.send_dtmf("1#")
            await phone.wait_closed(within=30)          # the WAV (plus tail silence) ended: baresip hung up
        heard = read_wav(phone.last_recording().decoded)  # what the gateway sent back
        correlation, lag = align_and_correlate(read_wav(speech_8k).samples, heard.samples, 8000)
        assert correlation >= 0.9                       # the echo agent returned our speech

With pjsua2 instead (also for a gateway that calls out: `mode="callee"` and dial `phone.sip_uri`):

        phone = PjsuaPhone(peer_procs, tmp_path, mode="caller", uri=f"sip:agent@127.0.0.1:{GW_PORT}",
                           play=speech_8k, dtmf=[(1.0, "5")], hangup_on_eof=True)
        async with phone:
            await phone.wait_state("CONFIRMED", within=10)
            await phone.wait_done(within=30)
        heard = read_wav(phone.recording)

Behind the balancer: `KamailioDispatcher(peer_procs, tmp_path, workers=[f"sip:127.0.0.1:{port}", ...])`,
`await lb.wait_target(worker, active=True, within=10)`, then dial `lb.sip_uri("agent")`.

baresip 1.0 hangs up when its source WAV ends (pad with `tail_silence`) and does not resample (8 kHz mono
WAV for G.711, 48 kHz stereo for Opus). Each test should own one `ProcessGroup` (the `peer_procs`
fixture); when a test fails, pytest shows the teardown listing of every process's PID and log file.
"""
