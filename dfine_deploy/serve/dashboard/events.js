// The dashboard's events panel: line crossings and zone entries/exits as they happen (SSE from
// /v1/events/live), the stored ones with their snapshots (GET /v1/events, on servers with --events),
// and filters by stream, kind and class. Kept apart from dashboard.js; it shares only the tab's key,
// under the same sessionStorage item (dashboard.js asks for it).
"use strict";

(() => {
  const KEY_ITEM = "dfine-serve-api-key"; // dashboard.js's item
  const ROWS = 30;
  const KIND_LABELS = { line_cross: "crossed", zone_enter: "entered", zone_leave: "left" };
  const $ = (selector) => document.querySelector(selector);
  let stored = false; // the server keeps events (and their snapshots)
  let source = null;
  const snapshotUrls = new Map(); // event id -> blob URL, revoked when its row goes

  const key = () => sessionStorage.getItem(KEY_ITEM);
  const headers = () => (key() ? { "X-API-Key": key() } : {});

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function filters() {
    const form = new FormData($("#events-form"));
    const wanted = {};
    for (const name of ["stream", "kind", "class"]) {
      const value = (form.get(name) || "").trim();
      if (value) wanted[name] = value;
    }
    return wanted;
  }

  function matches(event, wanted) {
    return Object.entries(wanted).every(([name, value]) => event[name] === value);
  }

  async function snapshotCell(event) {
    const td = document.createElement("td");
    if (!event.snapshot) return td;
    const image = document.createElement("img");
    image.alt = `${event.class} #${event.track_id ?? "?"}`;
    image.className = "snapshot";
    td.append(image);
    const response = await fetch(event.snapshot, { headers: headers() });
    if (response.ok) {
      const url = URL.createObjectURL(await response.blob());
      snapshotUrls.set(event.id, url);
      image.src = url;
    }
    return td;
  }

  async function row(event) {
    const tr = document.createElement("tr");
    tr.dataset.id = event.id;
    const where = event.line ? `line ${event.line}` : `zone ${event.zone}`;
    const what = KIND_LABELS[event.kind] || event.kind;
    const direction = event.direction ? ` (${event.direction})` : "";
    const clip = event.clip ? `${event.clip.segment} @ ${event.clip.offset_s.toFixed(1)} s` : "";
    tr.append(
      cell(new Date(event.time * 1000).toLocaleTimeString()),
      cell(event.stream),
      cell(`${what} ${where}${direction}`),
      cell(event.class),
      cell(event.track_id === null ? "" : `#${event.track_id}`),
      await snapshotCell(event),
      cell(clip),
    );
    return tr;
  }

  function trim() {
    const body = $("#events tbody");
    while (body.rows.length > ROWS) {
      const last = body.rows[body.rows.length - 1];
      const url = snapshotUrls.get(last.dataset.id);
      if (url) URL.revokeObjectURL(url);
      snapshotUrls.delete(last.dataset.id);
      last.remove();
    }
    $("#no-events").hidden = body.rows.length > 0;
  }

  async function showStored() {
    const body = $("#events tbody");
    body.replaceChildren();
    if (!stored) return trim();
    const query = new URLSearchParams(Object.assign({ limit: String(ROWS) }, filters()));
    const response = await fetch(`/v1/events?${query}`, { headers: headers() });
    if (!response.ok) {
      $("#events-error").textContent = (await response.json()).detail;
      return;
    }
    $("#events-error").textContent = "";
    for (const event of await response.json()) body.append(await row(event));
    trim();
  }

  function listen() {
    if (source) source.close();
    const url = key() ? `/v1/events/live?api_key=${encodeURIComponent(key())}` : "/v1/events/live";
    source = new EventSource(url);
    source.addEventListener("detection-event", async (message) => {
      const event = JSON.parse(message.data);
      if (!matches(event, filters())) return;
      $("#events tbody").prepend(await row(event));
      trim();
    });
  }

  async function start() {
    const config = await (await fetch("/dashboard/config.json")).json();
    if (config.api_key_required && !key()) {
      setTimeout(start, 500); // dashboard.js asks for the key; start once the tab has it
      return;
    }
    stored = config.events_stored;
    $("#events-note").textContent = stored
      ? "stored events with their snapshots, newest first; new ones appear as they happen"
      : "this server keeps no events (start it with --events DIR): new ones appear as they happen";
    $("#events-form").addEventListener("submit", (submitted) => {
      submitted.preventDefault();
      showStored();
    });
    await showStored();
    listen();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
