// Live dashboard of the voice gateway control plane. Plain JS, no build step.
//
// Auth: the API token is entered once and kept in sessionStorage (this tab only). REST calls send it as
// a bearer header. EventSource cannot send headers, so POST /v1/session first sets an HttpOnly cookie
// scoped to /v1/events; it is refreshed every 30 minutes and whenever the stream is refused.
// State: GET /v1/calls + /v1/workers, then GET /v1/events?last_event_id=<id of that snapshot>; the
// browser resumes with Last-Event-ID after a drop; an `event: gap` triggers a full reload.
// Views (by the URL's hash): #/ live calls and workers; #/history the call history (history.js); #/calls/<id> one
// call (call.js). This file shares its helpers with those two as window.gatewayDashboard.
"use strict";

window.gatewayDashboard = { views: {} };

(() => {
  const TOKEN_KEY = "gateway.apiToken";
  const ENDED_LINGER_MS = 60_000;
  const HISTORY = 90;
  const CALL_EVENTS = ["call.started", "call.updated", "call.ended"];
  const WORKER_EVENTS = ["worker.registered", "worker.updated", "worker.draining", "worker.lost", "worker.gone"];

  const calls = new Map(); // id -> {call, history: number[], endedAt}
  const workers = new Map(); // id -> WorkerInfo
  let source = null;
  let lastEventId = 0;
  let authRequired = true;
  let sessionTimer = null;

  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };

  // ------------------------------------------------------------------------------------------ api
  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: "same-origin",
    });
    if (response.status === 401) {
      signOut("The API token was refused. Enter it again.");
      throw new Error("unauthorized");
    }
    if (!response.ok) {
      let message = `${response.status}`;
      let code = "";
      try { ({ message, code } = (await response.json()).error); } catch (_) { /* not JSON */ }
      const error = new Error(message);
      error.status = response.status;
      error.code = code;
      throw error;
    }
    return response.status === 204 ? null : response.json();
  }

  function toast(message, isError) {
    const node = el("div", isError ? "toast error" : "toast", message);
    $("toasts").append(node);
    setTimeout(() => node.remove(), isError ? 8000 : 4000);
  }

  // ---------------------------------------------------------------------------------------- login
  function showLogin(message) {
    $("main").hidden = true;
    $("nav").hidden = true;
    $("signout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopStream();
    fetch("/v1/session", { method: "DELETE", credentials: "same-origin" }).catch(() => {});
    showLogin(message);
  }

  async function openSession() {
    await api("POST", "/v1/session");
    clearInterval(sessionTimer);
    sessionTimer = setInterval(() => api("POST", "/v1/session").catch(() => {}), 30 * 60 * 1000);
  }

  async function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("nav").hidden = false;
    $("signout").hidden = !authRequired;
    try {
      await openSession(); // first: the recording player of a call's view needs the session's media cookie
      route();
      await reload();
    } catch (error) {
      if (error.message !== "unauthorized") toast(`Could not load: ${error.message}`, true);
    }
  }

  // ---------------------------------------------------------------------------------------- state
  async function reload() {
    const [page, workerList] = await Promise.all([
      api("GET", "/v1/calls?live=true&limit=500"),
      api("GET", "/v1/workers"),
    ]);
    calls.clear();
    workers.clear();
    for (const call of page.items) upsertCall(call);
    for (const worker of workerList.items) workers.set(worker.id, worker);
    lastEventId = page.last_event_id;
    renderAll();
    connect();
  }

  function upsertCall(call) {
    const entry = calls.get(call.id) || { call, history: [], endedAt: null };
    const stats = call.stats || {};
    if (entry.history.length === 0 && Array.isArray(stats.level_history)) {
      entry.history = stats.level_history.slice(-HISTORY);
    }
    const sample = stats.level_dbfs !== null && stats.level_dbfs !== undefined ? stats.level_dbfs : null;
    if (sample !== null && entry.call !== call) entry.history.push(sample);
    else if (sample !== null && entry.history.length === 0) entry.history.push(sample);
    if (entry.history.length > HISTORY) entry.history.splice(0, entry.history.length - HISTORY);
    entry.call = call;
    if (call.state === "ended" && !entry.endedAt) entry.endedAt = Date.now();
    calls.set(call.id, entry);
    return entry;
  }

  // --------------------------------------------------------------------------------------- stream
  function setConn(state, label) {
    const pill = $("conn");
    pill.className = `pill pill-${state}`;
    pill.textContent = label;
  }

  function stopStream() {
    if (source) source.close();
    source = null;
    setConn("off", "offline");
  }

  function connect() {
    stopStream();
    source = new EventSource(`/v1/events?last_event_id=${lastEventId}`, { withCredentials: true });
    setConn("warn", "connecting");
    source.onopen = () => setConn("live", "live");
    source.onerror = () => {
      if (source && source.readyState === EventSource.CLOSED) {
        // Refused (cookie expired or token rotated): renew the cookie, then reload the picture.
        setConn("off", "offline");
        setTimeout(() => openSession().then(reload).catch(() => {}), 2000);
      } else {
        setConn("warn", "reconnecting");
      }
    };
    for (const type of CALL_EVENTS) {
      source.addEventListener(type, (message) => {
        const event = JSON.parse(message.data);
        lastEventId = event.id;
        const entry = upsertCall(event.data);
        renderCallRow(entry, type === "call.started");
        renderSummary();
        document.dispatchEvent(new CustomEvent("gateway:call", { detail: event.data }));
      });
    }
    for (const type of WORKER_EVENTS) {
      source.addEventListener(type, (message) => {
        const event = JSON.parse(message.data);
        lastEventId = event.id;
        workers.set(event.data.id, event.data);
        renderWorkers();
        renderSummary();
      });
    }
    source.addEventListener("gap", () => {
      toast("Missed some events; reloading.", false);
      reload().catch((error) => toast(`Reload failed: ${error.message}`, true));
    });
  }

  // ---------------------------------------------------------------------------------- formatting
  const fmtDuration = (seconds) => {
    const s = Math.max(0, Math.floor(seconds));
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const rest = String(s % 60).padStart(2, "0");
    return h ? `${h}:${String(m).padStart(2, "0")}:${rest}` : `${m}:${rest}`;
  };
  const grade = (value, warnAt, badAt, higherIsBetter) => {
    if (value === null || value === undefined) return "dim";
    if (higherIsBetter) return value >= warnAt ? "good" : value >= badAt ? "warn" : "bad";
    return value < warnAt ? "good" : value < badAt ? "warn" : "bad";
  };
  const num = (value, digits) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));

  function callDuration(call) {
    if (call.state === "ended") return call.duration_s || 0;
    const since = call.answered || call.started;
    return since ? Date.now() / 1000 - since : 0;
  }

  // ----------------------------------------------------------------------------------- rendering
  function cell(cls, text, title) {
    const td = el("td", cls, text);
    if (title) td.title = title;
    return td;
  }

  function hangupButton(call) {
    const button = el("button", "btn btn-danger", "Hang up");
    button.type = "button";
    button.dataset.action = "hangup";
    button.setAttribute("aria-label", `Hang up call ${call.id}`);
    let armed = null;
    button.addEventListener("click", async () => {
      if (!armed) {
        // Two clicks: a stray click at 3 am must not drop a caller.
        button.classList.add("confirm");
        button.textContent = "Confirm";
        armed = setTimeout(() => { armed = null; button.classList.remove("confirm"); button.textContent = "Hang up"; }, 4000);
        return;
      }
      clearTimeout(armed);
      armed = null;
      button.disabled = true;
      button.textContent = "Hanging up…";
      try {
        await api("POST", `/v1/calls/${encodeURIComponent(call.id)}/hangup`, { reason: "dashboard" });
        toast(`Hang-up sent for ${call.from || call.id}`);
      } catch (error) {
        button.disabled = false;
        button.classList.remove("confirm");
        button.textContent = "Hang up";
        if (error.message !== "unauthorized") toast(`Hang-up failed: ${error.message}`, true);
      }
    });
    return button;
  }

  // The caller's context: name, where the identity came from, the kept headers (text only, never HTML).
  function contextLine(context) {
    if (!context) return null;
    const parts = [];
    if (context.caller_name) parts.push(context.caller_name);
    for (const [name, value] of Object.entries(context.headers || {})) parts.push(`${name}: ${value}`);
    for (const [key, value] of Object.entries(context.metadata || {})) parts.push(`${key}: ${value}`);
    if (context.diverted_from && context.diverted_from.length) parts.push(`diverted from ${context.diverted_from[0]}`);
    if (!parts.length) return null;
    return {
      text: parts.join(" · "),
      title: `caller from ${context.identity_source}` + (context.source ? ` via ${context.source}` : ""),
    };
  }

  function buildRow(entry) {
    const { call } = entry;
    const stats = call.stats || {};
    const row = el("tr");
    row.dataset.callId = call.id;
    row.dataset.state = call.state;
    if (call.state === "ended") row.classList.add("ended");

    const state = el("td");
    state.append(el("span", `badge st-${call.state}`, call.state));
    row.append(state);

    const who = el("td");
    const link = el("a", "parties", `${call.from || "?"} → ${call.to || "?"}`);
    link.href = `#/calls/${encodeURIComponent(call.id)}`;
    link.title = "Open the call: transcript, timeline, controls";
    who.append(link);
    const detail = call.state === "ended" && call.end_reason
      ? `${call.id} · ${call.end_reason}`
      : `${call.id} · ${call.direction} ${call.kind}${call.transport ? `/${call.transport}` : ""}`;
    who.append(el("span", "sub call-id", detail));
    const context = contextLine(call.context);
    if (context) {
      const line = el("span", "sub call-context", context.text);
      line.title = context.title;
      who.append(line);
    }
    row.append(who);

    const route = el("td");
    route.append(el("span", "parties", call.route || "–"));
    route.append(el("span", "sub", call.provider || ""));
    row.append(route);

    row.append(cell("", call.worker || "–"));
    // An SRTP call reads "PCMU · SRTP", the suite in its tooltip.
    row.append(call.srtp
      ? cell("", `${call.codec || "–"} · SRTP`, `media encrypted: ${call.srtp}`)
      : cell("", call.codec || "–"));
    row.append(cell("num duration", fmtDuration(callDuration(call))));
    row.append(cell(`num ${grade(stats.mos, 4.0, 3.6, true)}`, num(stats.mos, 2), "E-model MOS"));
    row.append(cell(`num ${grade(stats.loss_pct, 1, 3, false)}`, `${num(stats.loss_pct, 1)} %`,
      `${stats.rtp_lost || 0} lost of ${stats.rtp_packets_in || 0} received, ${stats.late || 0} late`));
    row.append(cell(`num ${grade(stats.jitter_ms, 30, 60, false)}`, `${num(stats.jitter_ms, 1)} ms`,
      `jitter buffer: ${stats.underruns || 0} underruns · ${stats.concealed || 0} frames concealed · ` +
      `${stats.discarded || 0} dropped · ${stats.inserted || 0} inserted`));
    const latency = stats.provider_latency_p50_ms === null || stats.provider_latency_p50_ms === undefined
      ? "–" : `${num(stats.provider_latency_p50_ms, 0)} / ${num(stats.provider_latency_last_ms, 0)} ms`;
    row.append(cell(`num ${grade(stats.provider_latency_p50_ms, 800, 1500, false)}`, latency,
      `barge-ins ${stats.barge_ins || 0} · resumes ${stats.resumes || 0} · tool calls ${stats.tool_calls || 0}` +
      ` · agent audio gaps ${stats.agent_audio_gaps || 0}`));

    const spark = el("td");
    const canvas = el("canvas", "spark");
    canvas.width = 280;
    canvas.height = 60;
    canvas.setAttribute("role", "img");
    const lastLevel = entry.history.length ? entry.history[entry.history.length - 1] : null;
    canvas.setAttribute("aria-label", lastLevel === null ? "no audio level yet" : `level ${lastLevel.toFixed(0)} dBFS`);
    drawSparkline(canvas, entry.history);
    spark.append(canvas);
    row.append(spark);

    const actions = el("td");
    if (call.state !== "ended") actions.append(hangupButton(call));
    row.append(actions);
    return row;
  }

  function drawSparkline(canvas, values) {
    const ctx = canvas.getContext("2d");
    const { width, height } = canvas;
    ctx.clearRect(0, 0, width, height);
    ctx.strokeStyle = "rgba(139, 152, 165, 0.25)";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(0, height - 1);
    ctx.lineTo(width, height - 1);
    ctx.stroke();
    if (values.length < 2) return;
    const floor = -60; // dBFS at the bottom of the box
    const y = (v) => height - 2 - ((Math.min(0, Math.max(floor, v)) - floor) / -floor) * (height - 6);
    const step = width / (HISTORY - 1);
    const x0 = width - (values.length - 1) * step;
    ctx.beginPath();
    values.forEach((v, i) => (i ? ctx.lineTo(x0 + i * step, y(v)) : ctx.moveTo(x0, y(v))));
    ctx.strokeStyle = "#58a6ff";
    ctx.lineWidth = 2.5;
    ctx.lineJoin = "round";
    ctx.stroke();
    ctx.lineTo(width, height);
    ctx.lineTo(x0, height);
    ctx.closePath();
    ctx.fillStyle = "rgba(88, 166, 255, 0.15)";
    ctx.fill();
  }

  const visible = (entry) => entry.call.state !== "ended" || $("show-ended").checked
    || (entry.endedAt && Date.now() - entry.endedAt < ENDED_LINGER_MS);

  function sortedEntries() {
    return [...calls.values()].filter(visible).sort((a, b) => {
      const live = (a.call.state === "ended") - (b.call.state === "ended");
      return live || (b.call.started || 0) - (a.call.started || 0);
    });
  }

  function renderCallRow(entry, isNew) {
    const body = $("calls-body");
    const existing = body.querySelector(`tr[data-call-id="${CSS.escape(entry.call.id)}"]`);
    if (!visible(entry)) {
      if (existing) existing.remove();
    } else {
      const row = buildRow(entry);
      if (existing) {
        const armed = existing.querySelector("button.confirm, button:disabled");
        if (armed && entry.call.state !== "ended") row.lastChild.replaceChildren(armed); // keep a pending click
        existing.replaceWith(row);
      } else {
        renderCalls();
        const fresh = body.querySelector(`tr[data-call-id="${CSS.escape(entry.call.id)}"]`);
        if (fresh && isNew) fresh.classList.add("flash");
      }
    }
    $("calls-empty").hidden = body.children.length > 0;
  }

  function renderCalls() {
    const body = $("calls-body");
    body.replaceChildren(...sortedEntries().map(buildRow));
    $("calls-empty").hidden = body.children.length > 0;
  }

  function renderWorkers() {
    const box = $("workers");
    const list = [...workers.values()].sort((a, b) => a.id.localeCompare(b.id));
    box.replaceChildren(...list.map(buildWorker));
    $("workers-empty").hidden = list.length > 0;
  }

  function buildWorker(worker) {
    const card = el("div", `worker ${worker.status}`);
    card.dataset.workerId = worker.id;
    const head = el("div", "worker-head");
    head.append(el("span", "worker-name", worker.id));
    head.append(el("span", `badge st-${worker.status}`, worker.status));
    card.append(head);
    const age = worker.last_heartbeat ? Math.max(0, Date.now() / 1000 - worker.last_heartbeat) : null;
    const meta = [worker.url || "in-process", worker.version && `v${worker.version}`,
      age !== null && `heartbeat ${age < 90 ? `${age.toFixed(0)} s` : `${(age / 60).toFixed(0)} min`} ago`];
    card.append(el("div", "worker-meta", meta.filter(Boolean).join(" · ")));
    // One line per trunk registration; a worker from before trunks sends the single registration only.
    const registrations = worker.registrations && worker.registrations.length
      ? worker.registrations : (worker.registration ? [worker.registration] : []);
    for (const reg of registrations) card.append(trunkLine(reg));
    const bar = el("div", "loadbar");
    const fill = el("span", grade(worker.load, 0.7, 0.9, false) === "good" ? "" : grade(worker.load, 0.7, 0.9, false));
    fill.style.width = `${Math.min(100, Math.round((worker.load || 0) * 100))}%`;
    bar.append(fill);
    card.append(bar);
    const foot = el("div", "worker-foot");
    // Capacity counts G.711 calls; Opus and browser calls take more of it (GATEWAY_OPUS_CALL_COST, _WEBRTC_CALL_COST).
    const used = worker.used || 0;
    const usage = used > worker.active_calls + 1e-6
      ? `${worker.active_calls} calls · ${Number(used.toFixed(1))} / ${worker.capacity} capacity`
      : `${worker.active_calls} / ${worker.capacity} calls`;
    foot.append(el("span", "", usage));
    if (worker.status === "up") foot.append(drainButton(worker));
    card.append(foot);
    return card;
  }

  // The worker's registration with a trunk (register = true): state, time left or next try, and why the last
  // attempt failed; the registrar, AOR and contact in the tooltip. The trunk default is just "trunk".
  function trunkLine(reg) {
    const now = Date.now() / 1000;
    const seconds = (at) => {
      const left = Math.max(0, at - now);
      return left < 120 ? `${Math.round(left)} s` : `${Math.round(left / 60)} min`;
    };
    const name = reg.trunk && reg.trunk !== "default" ? `trunk ${reg.trunk}` : "trunk";
    const parts = [`${name} ${reg.state}`];
    if ((reg.state === "registered" || reg.state === "refreshing") && reg.expires_at) {
      parts.push(`expires in ${seconds(reg.expires_at)}`);
    }
    if (reg.state === "failed") {
      if (reg.last_status) parts.push(`${reg.last_status}`);
      parts.push(`attempt ${reg.attempts}`);
      if (reg.next_attempt_at) parts.push(`retry in ${seconds(reg.next_attempt_at)}`);
    }
    const tone = { registered: "good", refreshing: "good", failed: "bad", registering: "warn" }[reg.state] || "";
    const box = el("div", `worker-trunk ${tone}`.trim());
    box.dataset.trunkState = reg.state;
    box.dataset.trunk = reg.trunk || "default";
    box.title = [`registrar ${reg.registrar}`, `AOR ${reg.aor}`, reg.contact && `contact ${reg.contact}`,
      reg.last_error].filter(Boolean).join("\n");
    box.append(el("div", "", parts.join(" · ")));
    if (reg.last_error) box.append(el("div", "worker-trunk-error", reg.last_error));
    return box;
  }

  function drainButton(worker) {
    const button = el("button", "btn btn-danger", "Drain");
    button.type = "button";
    button.dataset.action = "drain";
    button.title = "Stop sending new calls to this worker; its calls continue";
    let armed = null;
    button.addEventListener("click", async () => {
      if (!armed) {
        button.classList.add("confirm");
        button.textContent = "Confirm drain";
        armed = setTimeout(() => { armed = null; button.classList.remove("confirm"); button.textContent = "Drain"; }, 4000);
        return;
      }
      clearTimeout(armed);
      button.disabled = true;
      try {
        const updated = await api("POST", `/v1/workers/${encodeURIComponent(worker.id)}/drain`, { exit_when_empty: false });
        workers.set(updated.id, updated);
        renderWorkers();
        renderSummary();
        toast(`${worker.id} is draining`);
      } catch (error) {
        button.disabled = false;
        if (error.message !== "unauthorized") toast(`Drain failed: ${error.message}`, true);
      }
    });
    return button;
  }

  function renderSummary() {
    $("live-count").textContent = [...calls.values()].filter((e) => e.call.state !== "ended").length;
    $("workers-up").textContent = [...workers.values()].filter((w) => w.status === "up").length;
  }

  function renderAll() {
    renderCalls();
    renderWorkers();
    renderSummary();
  }

  // Durations tick every second; ended calls fade out of the table after a minute.
  setInterval(() => {
    for (const row of $("calls-body").children) {
      const entry = calls.get(row.dataset.callId);
      if (!entry) continue;
      if (!visible(entry)) { row.remove(); continue; }
      row.querySelector(".duration").textContent = fmtDuration(callDuration(entry.call));
    }
    $("calls-empty").hidden = $("calls-body").children.length > 0;
  }, 1000);

  // -------------------------------------------------------------------------------------- views
  // "#/history?number=555" -> {name: "history", params}; "#/calls/c-1" -> {name: "call", id: "c-1"}.
  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, query] = raw.split("?", 2);
    const params = new URLSearchParams(query || "");
    if (path.startsWith("calls/")) return { name: "call", id: decodeURIComponent(path.slice(6)), params };
    if (path === "history") return { name: "history", params };
    return { name: "live", params };
  }

  let shownView = null;

  function route() {
    if ($("main").hidden) return;
    const target = parseHash();
    for (const name of ["live", "history", "call"]) $(`view-${name}`).hidden = name !== target.name;
    for (const link of $("nav").querySelectorAll("a")) {
      if (link.dataset.view === target.name) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    const views = window.gatewayDashboard.views;
    if (shownView && shownView !== target.name && views[shownView]) views[shownView].hide();
    shownView = target.name;
    document.title = { live: "Voice gateway — live calls", history: "Voice gateway — call history",
      call: `Voice gateway — call ${target.id || ""}` }[target.name];
    if (views[target.name]) views[target.name].show(target);
  }

  Object.assign(window.gatewayDashboard, { $, el, api, toast, fmtDuration, grade, num });

  // ------------------------------------------------------------------------------------- wiring
  window.addEventListener("hashchange", route);
  document.addEventListener("DOMContentLoaded", async () => {
    $("show-ended").addEventListener("change", renderCalls);
    $("signout").addEventListener("click", () => signOut(""));
    $("login-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      await start();
    });
    try {
      const health = await (await fetch("/healthz")).json();
      authRequired = health.auth_required;
    } catch (_) {
      authRequired = true;
    }
    if (authRequired && !token()) showLogin("");
    else await start();
  });
})();
