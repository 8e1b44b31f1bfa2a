// One call's view (#/calls/<id>): GET /v1/calls/{id} as a header, quality figures, a timeline and the transcript
// beside it; the recording (GET /v1/calls/{id}/recording, authorised by the session's gateway_media cookie since
// an <audio> element sends no header) plays with the timeline: the playhead marks the current transcript item and
// timeline entry, and clicking one seeks there. A live call also gets the controls (say, inject, hand off) and is
// read again when the event stream reports it changed.
//
// Times: transcript items and tool calls carry seconds from the agent session's start, which is when the call
// was answered and its recording began; the timeline shows every entry on that clock (setup before 0).
"use strict";

(() => {
  const { views } = window.gatewayDashboard;
  const REFRESH_MS = 1000;

  let callId = null;
  let record = null;
  let entries = [];       // [{at, kind, title, detail, node, item}] in time order
  let items = [];         // transcript [{at, node}]
  let refreshTimer = null;
  let refreshing = false;
  let playable = false;   // an ended call with a recording: its items seek the player
  let loads = 0;          // the latest load's number: an answer to an older one (another call) is dropped

  const d = () => window.gatewayDashboard;
  const $ = (id) => document.getElementById(id);
  const path = (suffix) => `/v1/calls/${encodeURIComponent(callId)}${suffix || ""}`;

  const clock = (seconds) => {
    if (seconds === null || seconds === undefined) return "";
    const sign = seconds < 0 ? "−" : "";
    const s = Math.abs(seconds);
    return `${sign}${Math.floor(s / 60)}:${(s % 60).toFixed(1).padStart(4, "0")}`;
  };
  const has = (value) => value !== null && value !== undefined;

  // ---------------------------------------------------------------------------------------- load
  async function load() {
    const mine = ++loads;
    let answer;
    try {
      answer = await d().api("GET", path());
    } catch (error) {
      if (mine !== loads || error.message === "unauthorized") return;
      record = null;
      $("call-error").textContent = `${error.status || ""} ${error.message}`.trim();
      for (const id of ["call-head", "call-quality", "timeline", "transcript", "recording-box"]) $(id).replaceChildren();
      $("call-controls").hidden = true;
      return;
    }
    if (mine !== loads) return;
    record = answer;
    $("call-error").textContent = "";
    render();
  }

  function refreshSoon() {
    if (refreshTimer || refreshing) return;
    refreshTimer = setTimeout(async () => {
      refreshTimer = null;
      refreshing = true;
      try { await load(); } finally { refreshing = false; }
    }, REFRESH_MS);
  }

  // -------------------------------------------------------------------------------------- render
  function render() {
    const call = record;
    const { el } = d();
    $("call-title").textContent = `Call ${call.from || "?"} → ${call.to || "?"}`;
    const head = $("call-head");
    const badge = el("span", `badge st-${call.state}`, call.state);
    badge.id = "call-state";
    const facts = [
      ["Call id", call.id],
      ["Direction", `${call.direction} ${call.kind}${call.transport ? `/${call.transport}` : ""}`],
      ["Trunk", call.trunk],
      ["Route", call.route], ["Profile", call.profile], ["Provider", call.provider], ["Worker", call.worker],
      ["Codec", call.srtp ? `${call.codec} · SRTP ${call.srtp}` : call.codec],
      ["Started", call.started ? new Date(call.started * 1000).toLocaleString() : ""],
      ["Duration", d().fmtDuration(call.state === "ended" ? call.duration_s || 0 : Date.now() / 1000 - (call.answered || call.started || Date.now() / 1000))],
      ["End reason", call.end_reason], ["DTMF", call.dtmf], ["Trace id", call.trace_id],
    ];
    const list = el("dl", "facts");
    for (const [name, value] of facts) {
      if (!value) continue;
      list.append(el("dt", "", name), el("dd", "", value));
    }
    head.replaceChildren(badge, list);
    renderQuality(call.stats || {});
    playable = call.state === "ended" && Boolean(call.recording || call.recording_path);
    renderTimeline(call);
    renderTranscript(call);
    renderRecording(call);
    $("call-controls").hidden = call.state === "ended";
    if (call.state !== "ended") d().views.loadProfiles();
  }

  function renderQuality(stats) {
    const { el, grade, num } = d();
    const figures = [
      ["MOS", num(stats.mos, 2), grade(stats.mos, 4.0, 3.6, true), "E-model estimate (ITU-T G.107)"],
      ["Jitter", `${num(stats.jitter_ms, 1)} ms`, grade(stats.jitter_ms, 30, 60, false)],
      ["Loss", `${num(stats.loss_pct, 1)} %`, grade(stats.loss_pct, 1, 3, false),
        `${stats.rtp_lost || 0} lost of ${stats.rtp_packets_in || 0} received`],
      ["Concealed", `${stats.concealed || 0} frames`, stats.concealed ? "warn" : "", "caller frames played as concealment"],
      ["Late", `${stats.late || 0} packets`, ""],
      ["Round trip", has(stats.rtt_ms) ? `${num(stats.rtt_ms, 0)} ms` : "–", ""],
      ["Agent latency", has(stats.provider_latency_p50_ms)
        ? `${num(stats.provider_latency_p50_ms, 0)} ms p50 · ${num(stats.provider_latency_last_ms, 0)} ms last` : "–",
        grade(stats.provider_latency_p50_ms, 800, 1500, false), "caller stops speaking → first agent audio"],
      ["Barge-ins", stats.barge_ins || 0, ""],
      ["Resumes", stats.resumes || 0, stats.resumes ? "warn" : ""],
      ["Tool calls", stats.tool_calls || 0, ""],
      ["Handoffs", stats.handoffs || 0, ""],
      ["Packets", `${stats.rtp_packets_in || 0} in · ${stats.rtp_packets_out || 0} out`, ""],
    ];
    const box = $("call-quality");
    box.replaceChildren();
    for (const [name, value, tone, title] of figures) {
      const group = el("div", "figure");
      group.dataset.figure = name.toLowerCase().replace(/[^a-z]+/g, "-");
      const dd = el("dd", tone, value);
      if (title) group.title = title;
      group.append(el("dt", "", name), dd);
      box.append(group);
    }
  }

  // The entries a record supports: setup, answer, each transcript item (a cut-off agent item is a barge-in), each
  // tool call, the handoffs (failed ones too) when the record lists them, and the end. Missing fields are skipped.
  function timelineOf(call) {
    const zero = call.answered || call.started;
    const rel = (epoch) => (has(epoch) && has(zero) ? epoch - zero : null);
    const list = [];
    if (has(call.started)) {
      list.push({ at: rel(call.started), kind: "setup", title: "Call set up",
        detail: `${call.direction} ${call.kind} from ${call.from || "?"} to ${call.to || "?"}` });
    }
    if (has(call.answered)) list.push({ at: 0, kind: "answer", title: "Answered", detail: call.codec || "" });
    (call.transcript || []).forEach((line, index) => {
      const who = { user: "Caller", assistant: "Agent", system: "System" }[line.role] || line.role;
      list.push({ at: line.start_s, kind: `turn-${line.role}`, title: `${who} spoke`, detail: line.text, item: index });
      if (line.truncated) {
        list.push({ at: has(line.end_s) ? line.end_s : line.start_s, kind: "barge-in", title: "Barge-in",
          detail: "the caller cut the agent off" });
      }
    });
    for (const tool of call.tools || []) {
      const took = has(tool.duration_ms) ? ` · ${Math.round(tool.duration_ms)} ms` : "";
      list.push({ at: tool.start_s, kind: "tool", title: `Tool ${tool.name}`,
        detail: `${tool.arguments || "{}"} → ${tool.result || "(no result)"}${took}` });
    }
    for (const handoff of call.handoffs || []) {
      const failed = handoff.ok === false;
      list.push({ at: handoff.at_s, kind: failed ? "handoff-failed" : "handoff",
        title: failed ? "Handoff failed" : "Handoff",
        detail: [`${handoff.from_profile || "?"} → ${handoff.to_profile || "?"}`,
          handoff.initiator && `by ${handoff.initiator === "api" ? "the API" : "the agent"}`,
          handoff.reason, handoff.error].filter(Boolean).join(" · ") });
    }
    for (const dtmf of call.dtmf_events || []) {
      const received = dtmf.direction === "received";
      list.push({ at: dtmf.at_s, kind: "dtmf", title: received ? "Caller pressed a key" : "Key sent to the caller",
        detail: dtmf.digit });
    }
    // Stable by time; entries without a time keep their place after those before them.
    let last = -Infinity;
    list.forEach((entry, i) => { entry.order = has(entry.at) ? entry.at : last; entry.index = i; last = entry.order; });
    list.sort((a, b) => a.order - b.order || a.index - b.index);
    // The end comes last whatever its clock says (a worker's item times and the plane's end are two clocks).
    if (call.state === "ended" && has(call.ended)) {
      const at = Math.max(rel(call.ended) ?? 0, ...list.filter((e) => has(e.at)).map((e) => e.at));
      list.push({ at, kind: "end", title: "Ended", detail: call.end_reason || "" });
    }
    return list;
  }

  // With a recording, an item is a button that plays from its time; without one it is plain text.
  function seekButton(entry, label, children) {
    const { el } = d();
    if (!playable) {
      const box = el("div", "seek static");
      box.append(...children);
      return box;
    }
    const button = el("button", "seek");
    button.type = "button";
    if (has(entry.at)) button.dataset.at = String(Math.max(0, entry.at));
    button.setAttribute("aria-label", `${label}${has(entry.at) ? ` at ${clock(entry.at)}` : ""}: play from here`);
    button.append(...children);
    button.addEventListener("click", () => seek(entry.at));
    return button;
  }

  function renderTimeline(call) {
    const { el } = d();
    entries = timelineOf(call);
    $("timeline").replaceChildren(...entries.map((entry) => {
      const li = el("li", `tl tl-${entry.kind}`);
      li.dataset.kind = entry.kind;
      const parts = [el("span", "tl-time", clock(entry.at)), el("span", "tl-title", entry.title)];
      if (entry.detail) parts.push(el("span", "tl-detail", entry.detail));
      li.append(seekButton(entry, entry.title, parts));
      entry.node = li;
      return li;
    }));
  }

  function renderTranscript(call) {
    const { el } = d();
    const lines = call.transcript || [];
    items = lines.map((line) => {
      const li = el("li", `said said-${line.role}`);
      li.dataset.role = line.role;
      const who = { user: "Caller", assistant: "Agent", system: "System" }[line.role] || line.role;
      const parts = [el("span", "said-who", who), el("span", "said-time", clock(line.start_s)),
        el("span", "said-text", line.text)];
      if (line.truncated) parts.push(el("span", "said-cut", "cut off"));
      const entry = { at: line.start_s, node: li };
      li.append(seekButton(entry, `${who}: ${line.text.slice(0, 60)}`, parts));
      return entry;
    });
    $("transcript").replaceChildren(...items.map((entry) => entry.node));
    $("transcript-empty").hidden = items.length > 0;
    follow();
  }

  // ------------------------------------------------------------------------------------ recording
  function renderRecording(call) {
    const { el } = d();
    const box = $("recording-box");
    const audio = $("player");
    if (audio && audio.dataset.callId === call.id) return; // keep playing across refreshes
    const recording = call.recording || (call.recording_path ? { path: call.recording_path } : null);
    if (!recording) {
      box.replaceChildren(el("p", "empty", call.state === "ended" ? "This call was not recorded."
        : "A recording, if the call is recorded, is here once the call has ended."));
      return;
    }
    if (call.state !== "ended") {
      box.replaceChildren(el("p", "empty", "Recording; it plays here once the call has ended."));
      return;
    }
    const player = document.createElement("audio");
    player.id = "player";
    player.controls = true;
    player.preload = "metadata";
    player.dataset.callId = call.id;
    player.setAttribute("aria-label", `Recording of call ${call.id}`);
    player.src = path("/recording");
    const about = [recording.format && recording.format.toUpperCase(),
      recording.channels === 2 ? "stereo: caller left, agent right" : recording.channels === 1 ? "mono" : "",
      recording.sample_rate && `${recording.sample_rate / 1000} kHz`,
      has(recording.duration_s) && recording.duration_s ? `${recording.duration_s.toFixed(1)} s` : "",
      recording.bytes ? `${(recording.bytes / 1024).toFixed(0)} KiB` : ""].filter(Boolean).join(" · ");
    const problem = el("p", "error");
    problem.id = "recording-error";
    problem.setAttribute("role", "alert");
    player.addEventListener("timeupdate", follow);
    player.addEventListener("seeked", follow);
    player.addEventListener("error", () => { problem.textContent = recordingProblem(player); });
    box.replaceChildren(player, el("p", "sub", about), problem);
  }

  function recordingProblem(player) {
    const code = player.error ? player.error.code : 0;
    const reason = { 2: "the network failed", 3: "it cannot be decoded", 4: "the file is missing or refused" }[code];
    // The answer's JSON reason is not readable from an <audio> element: ask once with fetch to show it.
    fetch(player.src, { method: "GET", headers: { Range: "bytes=0-0" }, credentials: "same-origin" })
      .then(async (response) => {
        if (response.ok) return;
        const body = await response.json().catch(() => null);
        const message = body && body.error ? body.error.message : `${response.status}`;
        $("recording-error").textContent = `Recording unavailable: ${response.status} ${message}`;
      })
      .catch(() => {});
    return `Recording unavailable: ${reason || "it cannot be played"}`;
  }

  function seek(at) {
    const player = $("player");
    if (!player || !has(at)) return;
    player.currentTime = Math.max(0, at);
    if (player.paused) player.play().catch(() => {});
  }

  // The playhead's item: the one that began last at or before it (items need not be listed in time order: a
  // message injected mid-reply is listed after the reply it came during).
  function mark(list, now) {
    let current = null;
    for (const entry of list) {
      if (has(entry.at) && entry.at <= now && (current === null || entry.at > current.at)) current = entry;
    }
    for (const entry of list) {
      const on = entry === current;
      entry.node.classList.toggle("current", on);
      if (on) entry.node.setAttribute("aria-current", "true");
      else entry.node.removeAttribute("aria-current");
    }
    return current;
  }

  function follow() {
    const player = $("player");
    if (!player || player.dataset.callId !== callId) return;
    const now = player.currentTime;
    const item = mark(items, now);
    mark(entries, now);
    if (item && !player.paused) item.node.scrollIntoView({ block: "nearest" });
  }

  // ------------------------------------------------------------------------------------- controls
  function report(message, error) {
    $("control-status").textContent = error ? "" : message;
    $("control-error").textContent = error ? message : "";
  }

  async function command(action, body, done) {
    try {
      await d().api("POST", path(`/${action}`), body);
      report(done, false);
      refreshSoon();
      return true;
    } catch (error) {
      if (error.message !== "unauthorized") {
        report(`${action} refused: ${error.status || ""}${error.code ? ` ${error.code}` : ""} — ${error.message}`, true);
      }
      return false;
    }
  }

  async function onControl(event) {
    event.preventDefault();
    const text = $("control-text").value.trim();
    if (!text) { report("Type the text first.", true); return; }
    const action = event.submitter && event.submitter.dataset.action === "inject" ? "inject" : "say";
    const buttons = $("control-form").querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    const ok = action === "say"
      ? await command("say", { text, interrupt: $("control-interrupt").checked }, "The agent will say it.")
      : await command("inject", { text, role: $("control-role").value, respond: $("control-respond").checked },
        `Injected as a ${$("control-role").value} message.`);
    buttons.forEach((b) => { b.disabled = false; });
    if (ok) $("control-text").value = "";
  }

  async function onHandoff(event) {
    event.preventDefault();
    const profile = $("handoff-profile").value.trim();
    if (!profile) { report("Pick a profile first.", true); return; }
    const button = $("handoff-form").querySelector("button");
    button.disabled = true;
    await command("handoff", { profile }, `Handing off to ${profile}.`);
    button.disabled = false;
  }

  // ----------------------------------------------------------------------------------------- view
  views.call = {
    show(target) {
      if (target.id !== callId) {
        callId = target.id;
        record = null;
        report("", false);
        $("recording-box").replaceChildren();
        for (const id of ["call-head", "call-quality", "timeline", "transcript"]) $(id).replaceChildren();
        $("call-title").textContent = `Call ${callId}`;
      }
      $("call-back").href = views.lastHistoryHash || "#/history";
      load();
    },
    hide() {
      const player = $("player");
      if (player) player.pause();
    },
  };

  document.addEventListener("DOMContentLoaded", () => {
    $("control-form").addEventListener("submit", onControl);
    $("handoff-form").addEventListener("submit", onHandoff);
    document.addEventListener("gateway:call", (event) => {
      if (!$("view-call").hidden && record && event.detail.id === callId) refreshSoon();
    });
  });
})();
