// The call history view (#/history): GET /v1/calls with the form's filters, a page at a time.
//
// The filters live in the URL's hash (#/history?number=555&sort=-duration), so a search can be bookmarked or
// shared; the cursors of the pages seen so far are kept here, so "Previous" goes back without a new query form.
"use strict";

(() => {
  const { views } = window.gatewayDashboard;
  const PAGE_SIZE = 25;
  const FILTERS = ["since", "until", "number", "direction", "end_reason", "profile", "worker", "text", "sort"];

  let query = "";        // the filters of the page shown, as a query string
  let cursors = [null];  // cursors[n]: the cursor that reads page n (null: the first)
  let pageIndex = 0;
  let profilesLoaded = false;
  let loads = 0;         // the latest load's number: an answer to an older one (the user moved on) is dropped

  const d = () => window.gatewayDashboard;
  const $ = (id) => document.getElementById(id);

  // datetime-local values are local time; the API wants epoch seconds.
  const toEpoch = (value) => (value ? String(new Date(value).getTime() / 1000) : "");
  const fromEpoch = (value) => {
    if (!value) return "";
    const date = new Date(Number(value) * 1000);
    const local = new Date(date.getTime() - date.getTimezoneOffset() * 60_000);
    return local.toISOString().slice(0, 16);
  };

  function fillForm(params) {
    const form = $("history-form");
    for (const name of FILTERS) {
      const field = form.elements[name];
      const value = params.get(name) || "";
      field.value = name === "since" || name === "until" ? fromEpoch(value) : value;
      if (name === "sort" && !field.value) field.value = "-started";
    }
  }

  function formQuery() {
    const form = $("history-form");
    const params = new URLSearchParams();
    for (const name of FILTERS) {
      let value = form.elements[name].value.trim();
      if (name === "since" || name === "until") value = toEpoch(value);
      if (name === "sort" && value === "-started") value = "";
      if (value) params.set(name, value);
    }
    return params.toString();
  }

  async function loadProfiles() {
    if (profilesLoaded) return;
    try {
      const list = await d().api("GET", "/v1/profiles");
      $("profile-names").replaceChildren(...list.items.map((p) => {
        const option = document.createElement("option");
        option.value = p.name;
        option.label = `${p.name} (${p.provider})`;
        return option;
      }));
      profilesLoaded = true;
    } catch (_) { /* an older control plane: the fields stay free text */ }
  }
  views.loadProfiles = loadProfiles;

  const when = (epoch) => (epoch ? new Date(epoch * 1000).toLocaleString() : "–");

  function buildRow(call) {
    const { el, fmtDuration, grade, num } = d();
    const row = el("tr");
    row.dataset.callId = call.id;
    row.dataset.state = call.state;
    row.append(el("td", "", when(call.started)));
    const who = el("td");
    const link = el("a", "parties", `${call.from || "?"} → ${call.to || "?"}`);
    link.href = `#/calls/${encodeURIComponent(call.id)}`;
    who.append(link);
    who.append(el("span", "sub call-id", `${call.id} · ${call.direction} ${call.kind}`));
    row.append(who);
    const route = el("td");
    route.append(el("span", "parties", call.route || "–"));
    route.append(el("span", "sub", [call.profile, call.provider].filter(Boolean).join(" · ")));
    row.append(route);
    row.append(el("td", "", call.worker || "–"));
    row.append(el("td", "num", fmtDuration(call.duration_s || 0)));
    const end = el("td");
    end.append(call.state === "ended" ? el("span", "", call.end_reason || "–") : el("span", `badge st-${call.state}`, call.state));
    row.append(end);
    const mos = (call.stats || {}).mos;
    row.append(el("td", `num ${grade(mos, 4.0, 3.6, true)}`, num(mos, 2)));
    return row;
  }

  async function load() {
    const status = $("history-status");
    const params = new URLSearchParams(query);
    params.set("limit", String(PAGE_SIZE));
    if (cursors[pageIndex]) params.set("cursor", cursors[pageIndex]);
    status.classList.remove("error");
    status.textContent = "Loading…";
    $("history-prev").disabled = true;
    $("history-next").disabled = true;
    let page;
    const mine = ++loads;
    try {
      page = await d().api("GET", `/v1/calls?${params}`);
    } catch (error) {
      if (mine !== loads || error.message === "unauthorized") return;
      status.classList.add("error");
      status.textContent = `Search failed: ${error.status || ""} ${error.message}`.trim();
      $("history-body").replaceChildren();
      return;
    }
    if (mine !== loads) return;
    $("history-body").replaceChildren(...page.items.map(buildRow));
    $("history-empty").hidden = page.items.length > 0;
    if (page.next_cursor) cursors[pageIndex + 1] = page.next_cursor;
    cursors.length = page.next_cursor ? pageIndex + 2 : pageIndex + 1;
    const first = pageIndex * PAGE_SIZE + (page.items.length ? 1 : 0);
    const last = pageIndex * PAGE_SIZE + page.items.length;
    status.textContent = `${page.total} call${page.total === 1 ? "" : "s"} match` +
      (page.items.length ? `; showing ${first}–${last}` : "");
    $("history-page").textContent = `page ${pageIndex + 1}`;
    $("history-prev").disabled = pageIndex === 0;
    $("history-next").disabled = !page.next_cursor;
  }

  views.history = {
    show(target) {
      views.lastHistoryHash = location.hash || "#/history"; // the call view's way back to this search
      loadProfiles();
      const wanted = target.params.toString();
      fillForm(target.params);
      if (wanted !== query || !$("history-body").children.length) {
        query = wanted;
        cursors = [null];
        pageIndex = 0;
      }
      load();
    },
    hide() {},
  };

  document.addEventListener("DOMContentLoaded", () => {
    $("history-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const wanted = formQuery();
      const hash = wanted ? `#/history?${wanted}` : "#/history";
      query = null; // a new search starts at page 1, even with the same filters
      if (location.hash === hash) views.history.show({ params: new URLSearchParams(wanted) });
      else location.hash = hash;
    });
    $("history-clear").addEventListener("click", () => {
      $("history-form").reset();
      $("history-form").requestSubmit();
    });
    $("history-next").addEventListener("click", () => {
      if (!cursors[pageIndex + 1]) return;
      pageIndex += 1;
      load();
    });
    $("history-prev").addEventListener("click", () => {
      if (pageIndex === 0) return;
      pageIndex -= 1;
      load();
    });
  });
})();
