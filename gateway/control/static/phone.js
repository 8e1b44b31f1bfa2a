// Browser phone: one WebRTC call to the gateway (POST /v1/webrtc/offer, non-trickle), keypad DTMF and
// hang-up on the "control" data channel, and a level meter of the agent's audio (WebAudio AnalyserNode).
// URL options: ?route=NAME, a call token as #token=... (or ?token=...), ?raw=1 turns off the browser's
// echo cancellation / noise suppression / gain control.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = fragment.get("token") || params.get("token") || "";
  const route = params.get("route") || "";
  const raw = params.get("raw") === "1";
  const GATHER_TIMEOUT_MS = 5000;
  const DTMF_FREQS = {
    "1": [697, 1209], "2": [697, 1336], "3": [697, 1477],
    "4": [770, 1209], "5": [770, 1336], "6": [770, 1477],
    "7": [852, 1209], "8": [852, 1336], "9": [852, 1477],
    "*": [941, 1209], "0": [941, 1336], "#": [941, 1477],
  };

  // State visible to scripts (and to the end-to-end test) as window.phone.
  const phone = {
    state: "idle", // idle | starting | connecting | connected | ended | error
    callId: "",
    endReason: "",
    error: "",
    levelDb: -Infinity,
    history: [], // [time ms, level dBFS] of the agent audio, newest last (about 10 s)
  };
  window.phone = phone;

  let pc = null;
  let channel = null;
  let micStream = null;
  let audioContext = null;
  let analyser = null;
  let meterTimer = 0;
  let clockTimer = 0;
  let connectedAt = 0;

  function setStatus(text, state) {
    const status = $("status");
    status.textContent = text;
    status.dataset.state = state || phone.state;
  }

  function setState(state) {
    phone.state = state;
    const inCall = state === "starting" || state === "connecting" || state === "connected";
    $("call").disabled = inCall;
    $("hangup").disabled = !inCall;
    $("mute").disabled = state !== "connected";
    for (const key of document.querySelectorAll(".keypad button")) key.disabled = state !== "connected";
  }

  function showTimer() {
    const seconds = connectedAt ? Math.floor((Date.now() - connectedAt) / 1000) : 0;
    const mm = String(Math.floor(seconds / 60)).padStart(2, "0");
    const ss = String(seconds % 60).padStart(2, "0");
    $("timer").textContent = `${mm}:${ss}`;
  }

  function showLevel(db) {
    const clamped = Math.max(-80, Math.min(0, db));
    $("meter-mask").style.width = `${100 - ((clamped + 80) / 80) * 100}%`;
    $("meter").setAttribute("aria-valuenow", String(Math.round(clamped)));
    $("meter-db").textContent = Number.isFinite(db) ? `${db.toFixed(0)} dB` : "–∞ dB";
  }

  function startMeter(stream) {
    // Chromium feeds a remote stream to WebAudio only while a media element plays it too.
    const audio = $("remote");
    audio.srcObject = stream;
    audio.play().catch(() => {});
    audioContext = audioContext || new AudioContext();
    audioContext.resume().catch(() => {});
    analyser = audioContext.createAnalyser();
    analyser.fftSize = 2048;
    audioContext.createMediaStreamSource(stream).connect(analyser);
    const buffer = new Float32Array(analyser.fftSize);
    meterTimer = setInterval(() => {
      analyser.getFloatTimeDomainData(buffer);
      let sum = 0;
      for (const v of buffer) sum += v * v;
      const rms = Math.sqrt(sum / buffer.length);
      const db = rms > 0 ? 20 * Math.log10(rms) : -Infinity;
      phone.levelDb = db;
      phone.history.push([performance.now(), Number.isFinite(db) ? db : -200]);
      if (phone.history.length > 200) phone.history.shift();
      showLevel(db);
    }, 50);
  }

  // The agent's level over the last `ms` milliseconds: {max, mean (of dB values), samples}.
  phone.recentLevel = (ms) => {
    const since = performance.now() - ms;
    const values = phone.history.filter(([t]) => t >= since).map(([, db]) => db);
    if (!values.length) return { max: -200, mean: -200, samples: 0 };
    return {
      max: Math.max(...values),
      mean: values.reduce((a, b) => a + b, 0) / values.length,
      samples: values.length,
    };
  };

  function waitForGathering(connection) {
    if (connection.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        if (connection.iceGatheringState === "complete") {
          connection.removeEventListener("icegatheringstatechange", done);
          resolve();
        }
      };
      connection.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, GATHER_TIMEOUT_MS); // send what we have rather than wait forever
    });
  }

  async function call() {
    if (pc) return;
    phone.callId = "";
    phone.endReason = "";
    phone.error = "";
    $("digits").textContent = "";
    $("call-id").textContent = "";
    setState("starting");
    setStatus("Asking for the microphone…");
    try {
      audioContext = audioContext || new AudioContext(); // created on the click: autoplay rules
      const audio = raw ? { echoCancellation: false, noiseSuppression: false, autoGainControl: false } : true;
      micStream = await navigator.mediaDevices.getUserMedia({ audio });
      pc = new RTCPeerConnection({ iceServers: [] });
      for (const track of micStream.getAudioTracks()) pc.addTrack(track, micStream);
      channel = pc.createDataChannel("control");
      channel.onmessage = (event) => onControlMessage(event.data);
      pc.ontrack = (event) => startMeter(event.streams[0] || new MediaStream([event.track]));
      pc.onconnectionstatechange = onConnectionState;
      setState("connecting");
      setStatus("Connecting…");
      await pc.setLocalDescription(await pc.createOffer());
      await waitForGathering(pc);
      const headers = { "Content-Type": "application/json" };
      if (token) headers.Authorization = `Bearer ${token}`;
      const body = { sdp: pc.localDescription.sdp, type: "offer" };
      if (route) body.route = route;
      const response = await fetch("/v1/webrtc/offer", { method: "POST", headers, body: JSON.stringify(body) });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) {
        const message = (answer.error && answer.error.message) || `HTTP ${response.status}`;
        throw new Error(message);
      }
      if (!pc) return; // hung up while waiting
      phone.callId = answer.call_id;
      $("call-id").textContent = `call ${answer.call_id}`;
      await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    } catch (error) {
      fail(error);
    }
  }

  function onConnectionState() {
    if (!pc) return;
    const state = pc.connectionState;
    if (state === "connected") {
      setState("connected");
      setStatus("Connected — talk to the agent", "connected");
      connectedAt = Date.now();
      clockTimer = setInterval(showTimer, 500);
    } else if (state === "failed") {
      end("connection failed");
    } else if (state === "closed" || state === "disconnected") {
      if (phone.state === "connected") end(phone.endReason || "connection lost");
    }
  }

  function onControlMessage(data) {
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    if (message.type === "ended") {
      end(message.reason || "ended by the agent");
    } else if (message.type === "dtmf") {
      $("digits").textContent += ` ⟵${message.digits}`;
    }
  }

  function send(message) {
    if (channel && channel.readyState === "open") channel.send(JSON.stringify(message));
  }

  function beep(digit) {
    if (!audioContext || !DTMF_FREQS[digit]) return;
    const gain = audioContext.createGain();
    gain.gain.value = 0.08;
    gain.connect(audioContext.destination);
    const stopAt = audioContext.currentTime + 0.12;
    for (const freq of DTMF_FREQS[digit]) {
      const osc = audioContext.createOscillator();
      osc.frequency.value = freq;
      osc.connect(gain);
      osc.start();
      osc.stop(stopAt);
    }
  }

  function pressDigit(digit) {
    if (phone.state !== "connected") return;
    send({ type: "dtmf", digit, duration_ms: 160 });
    beep(digit);
    $("digits").textContent += digit;
  }

  function toggleMute() {
    if (!micStream) return;
    const button = $("mute");
    const muted = button.getAttribute("aria-pressed") !== "true";
    for (const track of micStream.getAudioTracks()) track.enabled = !muted;
    button.setAttribute("aria-pressed", String(muted));
    button.querySelector(".label").textContent = muted ? "Unmute" : "Mute";
  }

  function hangUp() {
    send({ type: "hangup" });
    end("you hung up");
  }

  function teardown() {
    clearInterval(meterTimer);
    clearInterval(clockTimer);
    meterTimer = clockTimer = 0;
    if (pc) {
      // Give a queued hang-up message a moment on the wire before DTLS closes.
      const closing = pc;
      setTimeout(() => closing.close(), 200);
    }
    pc = null;
    channel = null;
    if (micStream) for (const track of micStream.getTracks()) track.stop();
    micStream = null;
    $("remote").srcObject = null;
    const mute = $("mute");
    mute.setAttribute("aria-pressed", "false");
    mute.querySelector(".label").textContent = "Mute";
    phone.levelDb = -Infinity;
    showLevel(-Infinity);
  }

  function end(reason) {
    if (phone.state === "ended" || phone.state === "idle") return;
    phone.endReason = reason;
    teardown();
    setState("ended");
    setStatus(`Call ended — ${reason.replaceAll("_", " ")}`, "ended");
    if (token) $("call-id").textContent += " · this link's token is spent; ask for a new link to call again";
  }

  function fail(error) {
    phone.error = String(error && error.message ? error.message : error);
    teardown();
    setState("error");
    setStatus(`Could not call: ${phone.error}`, "error");
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("route").textContent = route || (token ? "from your link" : "public");
    $("call").addEventListener("click", call);
    $("hangup").addEventListener("click", hangUp);
    $("mute").addEventListener("click", toggleMute);
    for (const key of document.querySelectorAll(".keypad button")) {
      key.addEventListener("click", () => pressDigit(key.dataset.digit));
    }
    document.addEventListener("keydown", (event) => {
      if (DTMF_FREQS[event.key]) pressDigit(event.key);
    });
    setState("idle");
    showLevel(-Infinity);
    if (!window.RTCPeerConnection || !navigator.mediaDevices) {
      setStatus("This browser cannot make WebRTC calls (or the page is not served over HTTPS)", "error");
      $("call").disabled = true;
    }
  });
  window.addEventListener("pagehide", () => {
    if (pc) hangUp();
  });
})();
