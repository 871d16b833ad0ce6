// The dfine-serve dashboard: streams and their state, live annotated views with the counting editor
// (counting.js), counts per class, recent detections. Plain JavaScript, no build step, nothing loaded
// from elsewhere; data reaches the page only through textContent (`element`, from text.js). The API key
// (when the server has one) is asked once and kept in this tab's sessionStorage; it goes in the X-API-Key
// header for fetch, and as ?api_key= only where a browser cannot set headers: EventSource and the MJPEG
// <img>.
"use strict";

const KEY_ITEM = "dfine-serve-api-key";
const REFRESH_MS = 1000;
const RECENT_ROWS = 15;
const RECENT_WINDOW_S = 10; // an object stays in the recent table this long after it was last seen
const STATE_LABELS = { retrying: "reconnecting" };

let apiKey = sessionStorage.getItem(KEY_ITEM);
let timer = null;
const views = new Map(); // stream name -> { card, source, editor }
// recent objects, one entry per tracked object (or per class of untracked ones) and stream; the table is
// drawn from it once a second, so a busy stream never makes it scroll
const recent = new Map();
let newestSeen = 0;
const removing = new Set(); // names deleted here that a refresh already in flight may still list

const $ = (selector) => document.querySelector(selector);

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
  const cell = element("td", undefined, "counts");
  if (!counts) return cell;
  for (const [line, c] of Object.entries(counts.lines)) {
    cell.append(element("div", `${line}: ${describeLineCounts(c)}`));
  }
  for (const [zone, c] of Object.entries(counts.zones)) {
    cell.append(element("div", `${zone}: ${describeZoneCounts(c)}`));
  }
  return cell;
}

// each class's score threshold in force, as the API gives it (not rounded), and where it came from
function describeThresholds(thresholds) {
  const cell = element("td", undefined, "thresholds");
  for (const [name, t] of Object.entries(thresholds || {})) {
    cell.append(element("div", `${name} ≥ ${t.threshold} (${t.source})`));
  }
  return cell;
}

function renderTable(streams) {
  const body = $("#streams tbody");
  body.replaceChildren();
  for (const info of streams) {
    const row = element("tr");
    row.dataset.stream = info.name;
    const remove = element("button", "Remove");
    remove.addEventListener("click", () => removeStream(info.name));
    row.append(
      element("td", info.name),
      describeState(info),
      element("td", info.fps.toFixed(1)),
      element("td", String(info.frames_dropped)),
      element("td", `${info.latency_ms.toFixed(0)} ms`),
      describeCounts(info.counts),
      describeThresholds(info.class_thresholds),
      element("td"),
    );
    row.lastChild.append(remove);
    body.append(row);
  }
  $("#no-streams").hidden = streams.length > 0;
}

// `tracked`: the stream tracks, so a detection without an id is an object's first frame (its id comes
// with the next one) and gets no row of its own.
function noteRecent(result, tracked) {
  const at = result.timestamp;
  newestSeen = Math.max(newestSeen, at);
  const untracked = new Map(); // class -> how many in this frame
  for (const det of result.detections) {
    if (tracked && det.track_id === null) continue;
    if (det.track_id === null) untracked.set(det.name, (untracked.get(det.name) || 0) + 1);
    const key = det.track_id === null ? `${result.stream}\n?${det.name}` : `${result.stream}\n#${det.track_id}`;
    let entry = recent.get(key);
    if (!entry) {
      entry = { stream: result.stream, track: det.track_id, name: det.name, first: at, frames: 0, best: 0, seenIn: -1 };
      recent.set(key, entry);
    }
    if (entry.seenIn !== result.frame_index) entry.frames += 1; // frames with the object (or its class)
    entry.seenIn = result.frame_index;
    entry.name = det.name;
    entry.last = at;
    entry.best = Math.max(entry.best, det.score);
  }
  for (const [name, n] of untracked) recent.get(`${result.stream}\n?${name}`).inFrame = n;
}

function renderRecent() {
  for (const [key, entry] of recent) if (entry.last < newestSeen - RECENT_WINDOW_S) recent.delete(key);
  // objects still in view first, each in the order it appeared, so a row stays where it is while its
  // object is seen; then those that left, most recent first
  const inView = (entry) => entry.last >= newestSeen - 1;
  const entries = [...recent.values()].sort(
    (a, b) => inView(b) - inView(a) || (inView(a) ? a.first - b.first : b.last - a.last),
  );
  const rows = entries.slice(0, RECENT_ROWS).map((entry) => {
    const row = element("tr");
    const object = entry.track === null ? `${entry.inFrame} untracked` : `#${entry.track}`;
    row.append(
      element("td", entry.stream),
      element("td", object),
      element("td", entry.name),
      element("td", String(entry.frames)),
      element("td", entry.best.toFixed(2)),
      element("td", new Date(entry.last * 1000).toLocaleTimeString()),
    );
    return row;
  });
  $("#recent tbody").replaceChildren(...rows);
  const shown = rows.length < entries.length ? `, showing the ${rows.length} latest` : "";
  const summary = `${entries.length} object(s) seen in the last ${RECENT_WINDOW_S} s${shown}; updated once a second`;
  $("#recent-summary").textContent = summary;
}

function openView(name) {
  const path = `/v1/streams/${encodeURIComponent(name)}`;
  const card = element("div", undefined, "view");
  card.dataset.stream = name;
  const image = element("img");
  image.alt = `${name}, annotated`;
  image.src = withKey(`${path}/mjpeg`);
  const tracks = element("div", "tracks: none yet", "tracks");
  card.append(element("strong", name));
  const editor = new CountingEditor(name, card, image, api);
  card.insertBefore(tracks, editor.hint);
  $("#views").append(card);
  const source = new EventSource(withKey(`${path}/events`));
  source.onmessage = (event) => {
    const result = JSON.parse(event.data);
    editor.setFrameSize(result.width, result.height);
    const ids = result.detections.filter((d) => d.track_id !== null).map((d) => `#${d.track_id} ${d.name}`);
    tracks.textContent = ids.length ? `tracks: ${ids.join(", ")}` : "tracks: none in this frame";
    noteRecent(result, editor.saved.track);
  };
  source.addEventListener("end", () => source.close()); // the stream was removed
  views.set(name, { card, source, editor });
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
  const fetchedAt = Date.now();
  try {
    const listed = await (await api("/v1/streams")).json();
    for (const name of removing) if (!listed.some((s) => s.name === name)) removing.delete(name);
    const streams = listed.filter((s) => !removing.has(s.name));
    renderTable(streams);
    const names = new Set(streams.map((s) => s.name));
    for (const name of views.keys()) if (!names.has(name)) closeView(name);
    for (const name of names) if (!views.has(name)) openView(name);
    for (const info of streams) views.get(info.name).editor.sync(info, fetchedAt);
    renderRecent();
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
  error.replaceChildren();
  const body = { url: form.url.value.trim(), track: form.track.checked, every_frame: form.every_frame.checked };
  if (form.name.value.trim()) body.name = form.name.value.trim();
  try {
    if (form.counting.value.trim()) {
      try {
        Object.assign(body, JSON.parse(form.counting.value));
      } catch (failure) {
        const hint = "or leave it empty and draw on the live view";
        throw new Error(`Counting is not valid JSON (${failure.message}); ${hint}.`);
      }
    }
    const response = await api("/v1/streams", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      error.replaceChildren(...describeProblem((await response.json()).detail).map((s) => element("div", s)));
      return;
    }
    form.reset();
  } catch (failure) {
    error.replaceChildren(element("div", failure.message));
  } finally {
    await refresh();
  }
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
  $("#unverified").hidden = !config.unverified_engine;
  if (config.api_key_required && !apiKey) askForKey();
  else start();
});
