// The dfine-serve dashboard: streams and their state, live annotated views, counts, recent detections.
// Plain JavaScript, no build step, nothing loaded from elsewhere. The API key (when the server has one)
// is asked once and kept in this tab's sessionStorage; it goes in the X-API-Key header for fetch, and
// as ?api_key= only where a browser cannot set headers: EventSource and the MJPEG <img>.
"use strict";

const KEY_ITEM = "dfine-serve-api-key";
const REFRESH_MS = 1000;
const RECENT_ROWS = 15;
const STATE_LABELS = { retrying: "reconnecting" };

let apiKey = sessionStorage.getItem(KEY_ITEM);
let timer = null;
const views = new Map(); // stream name -> { card, source }
const removing = new Set(); // names deleted here that a refresh already in flight may still list

const $ = (selector) => document.querySelector(selector);

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function withKey(url) {
  return apiKey ? `${url}?api_key=${encodeURIComponent(apiKey)}` : url;
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers, apiKey ? { "X-API-Key": apiKey } : {});
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) {
    askForKey();
    throw new Error("the server refused the API key");
  }
  return response;
}

function askForKey() {
  apiKey = null;
  sessionStorage.removeItem(KEY_ITEM);
  clearInterval(timer);
  timer = null;
  $("#key-form").hidden = false;
  $("#status").textContent = "API key needed";
}

function describeState(info) {
  const label = STATE_LABELS[info.state] || info.state;
  const cell = element("td");
  cell.append(element("span", label, `state state-${label}`));
  if (info.last_error) cell.append(" ", element("span", info.last_error, "muted reason"));
  return cell;
}

function describeCounts(counts) {
  if (!counts) return "";
  const sum = (byClass) => Object.values(byClass).reduce((a, b) => a + b, 0);
  const parts = [];
  for (const [line, c] of Object.entries(counts.lines)) parts.push(`${line}: in ${sum(c.in)} / out ${sum(c.out)}`);
  for (const [zone, c] of Object.entries(counts.zones)) parts.push(`${zone}: ${sum(c)} inside`);
  return parts.join("; ");
}

function renderTable(streams) {
  const body = $("#streams tbody");
  body.replaceChildren();
  for (const info of streams) {
    const row = element("tr");
    row.dataset.stream = info.name;
    const remove = element("button", "Remove");
    remove.addEventListener("click", () => removeStream(info.name));
    const counts = element("td", describeCounts(info.counts), "counts");
    if (info.counts) counts.title = JSON.stringify(info.counts);
    row.append(
      element("td", info.name),
      describeState(info),
      element("td", info.fps.toFixed(1)),
      element("td", String(info.frames_dropped)),
      element("td", `${info.latency_ms.toFixed(0)} ms`),
      counts,
      element("td"),
    );
    row.lastChild.append(remove);
    body.append(row);
  }
  $("#no-streams").hidden = streams.length > 0;
}

function addRecent(result) {
  const body = $("#recent tbody");
  const time = new Date(result.timestamp * 1000).toLocaleTimeString();
  for (const det of result.detections) {
    const track = det.track_id === null ? "" : `#${det.track_id}`;
    const row = element("tr");
    row.append(
      element("td", time),
      element("td", result.stream),
      element("td", String(result.frame_index)),
      element("td", track),
      element("td", det.name),
      element("td", det.score.toFixed(2)),
    );
    body.prepend(row);
  }
  while (body.rows.length > RECENT_ROWS) body.deleteRow(-1);
}

function openView(name) {
  const path = `/v1/streams/${encodeURIComponent(name)}`;
  const card = element("div", undefined, "view");
  card.dataset.stream = name;
  const image = element("img");
  image.alt = `${name}, annotated`;
  image.src = withKey(`${path}/mjpeg`);
  const tracks = element("div", "tracks: none yet", "tracks");
  card.append(element("strong", name), image, tracks);
  $("#views").append(card);
  const source = new EventSource(withKey(`${path}/events`));
  source.onmessage = (event) => {
    const result = JSON.parse(event.data);
    const ids = result.detections.filter((d) => d.track_id !== null).map((d) => `#${d.track_id} ${d.name}`);
    tracks.textContent = ids.length ? `tracks: ${ids.join(", ")}` : "tracks: none in this frame";
    addRecent(result);
  };
  source.addEventListener("end", () => source.close()); // the stream was removed
  views.set(name, { card, source });
}

function closeView(name) {
  const view = views.get(name);
  if (!view) return;
  view.source.close();
  view.card.querySelector("img").removeAttribute("src");
  view.card.remove();
  views.delete(name);
}

async function refresh() {
  try {
    const listed = await (await api("/v1/streams")).json();
    for (const name of removing) if (!listed.some((s) => s.name === name)) removing.delete(name);
    const streams = listed.filter((s) => !removing.has(s.name));
    renderTable(streams);
    const names = new Set(streams.map((s) => s.name));
    for (const name of views.keys()) if (!names.has(name)) closeView(name);
    for (const name of names) if (!views.has(name)) openView(name);
    $("#status").textContent = `${streams.length} stream(s), updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("#status").textContent = `not updated: ${error.message}`;
  }
}

async function removeStream(name) {
  removing.add(name);
  closeView(name); // before the DELETE, so the browser never reconnects to a stream that is gone
  try {
    await api(`/v1/streams/${encodeURIComponent(name)}`, { method: "DELETE" });
  } catch (error) {
    $("#status").textContent = `remove failed: ${error.message}`;
  }
  await refresh();
}

async function addStream(event) {
  event.preventDefault();
  const form = event.target;
  const error = $("#add-error");
  error.textContent = "";
  const body = { url: form.url.value.trim(), track: form.track.checked, every_frame: form.every_frame.checked };
  if (form.name.value.trim()) body.name = form.name.value.trim();
  try {
    if (form.counting.value.trim()) Object.assign(body, JSON.parse(form.counting.value));
    const response = await api("/v1/streams", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      const detail = (await response.json()).detail;
      throw new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    }
    form.reset();
  } catch (failure) {
    error.textContent = failure.message;
  }
  await refresh();
}

function start() {
  $("#key-form").hidden = true;
  refresh();
  if (!timer) timer = setInterval(refresh, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", async () => {
  $("#add-form").addEventListener("submit", addStream);
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $("#key").value;
    sessionStorage.setItem(KEY_ITEM, apiKey);
    start();
  });
  const config = await (await fetch("/dashboard/config.json")).json();
  if (config.api_key_required && !apiKey) askForKey();
  else start();
});
