// Counting you draw: each live view gets an editor for its stream's counting lines and zones. Shapes are
// drawn, moved and deleted with the mouse on an SVG laid over the frame, in the stream's own pixels (the
// SVG's viewBox is the frame size the results report), and sent to the running stream with
// PATCH /v1/streams/{name} when the operator presses Apply. Every text goes in through textContent.
// Loaded after text.js (element, describeProblem, the count descriptions) and before dashboard.js, which
// creates one CountingEditor per view.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const HANDLE_PX = 6; // radius of a point's handle, in screen pixels
const MIN_LINE_PX = 8; // a shorter drag is a click, not a line (screen pixels)
const ARROW_PX = 24; // length of the arrow to a line's "in" side (screen pixels)
const HINTS = {
  select: "Drag a point to move it, a line or zone to move all of it; click one and press Delete to remove it.",
  line: "Press where the line starts and drag to where it ends.",
  zone: "Click each corner; click the first corner again (or Finish zone) to close it. Esc cancels.",
};

function svgElement(tag, attributes = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  return node;
}

// The side a crossing must end on to count "in": to the left of someone standing on the picture at the
// first point and facing the second (CountingLine.in_direction in settings.py).
function inDirection(start, end) {
  const dx = end[0] - start[0];
  const dy = end[1] - start[1];
  const length = Math.hypot(dx, dy) || 1;
  return [dy / length, -dx / length];
}

function copyShapes(lines, zones) {
  return {
    lines: lines.map((l) => ({ name: l.name, start: [...l.start], end: [...l.end] })),
    zones: zones.map((z) => ({ name: z.name, polygon: z.polygon.map((p) => [...p]) })),
  };
}

class CountingEditor {
  constructor(name, card, image, request) {
    this.name = name;
    this.request = request; // (path, options) -> fetch Response, with the key
    this.size = null; // [width, height] of the stream's frames, from its results
    this.saved = { lines: [], zones: [], track: false };
    this.draft = copyShapes([], []);
    this.track = false;
    this.dirty = false;
    this.appliedAt = 0;
    this.mode = "select";
    this.selected = null; // { kind: "lines" | "zones", index }
    this.gesture = null; // the drag in progress
    this.pendingZone = null; // corners of a zone being drawn
    this.pointer = null;
    this.counts = null;
    this.build(card, image);
    this.render();
  }

  build(card, image) {
    this.frameSize = element("span", "frame size: waiting for the first frame", "muted frame-size");
    this.frame = element("div", undefined, "frame");
    this.svg = svgElement("svg", { class: "overlay", tabindex: 0, preserveAspectRatio: "none" });
    this.frame.append(image, this.svg);
    const tools = element("div", undefined, "tools");
    this.buttons = {};
    for (const [mode, label] of [["select", "Select / move"], ["line", "Draw line"], ["zone", "Draw zone"]]) {
      const button = element("button", label);
      button.type = "button";
      button.dataset.mode = mode;
      button.addEventListener("click", () => this.setMode(mode));
      this.buttons[mode] = button;
    }
    this.finishButton = this.button("Finish zone", () => this.finishZone());
    this.deleteButton = this.button("Delete selected", () => this.deleteSelected());
    const trackLabel = element("label");
    this.trackBox = element("input");
    this.trackBox.type = "checkbox";
    this.trackBox.addEventListener("change", () => {
      this.track = this.trackBox.checked;
      this.changed();
    });
    trackLabel.append(this.trackBox, " track");
    this.applyButton = this.button("Apply", () => this.apply(), "apply");
    this.discardButton = this.button("Discard", () => this.discard());
    this.pending = element("span", "", "muted pending");
    tools.append(...Object.values(this.buttons), this.finishButton, this.deleteButton, trackLabel,
      this.applyButton, this.discardButton, this.pending);
    this.hint = element("p", "", "muted hint");
    this.direction = element("p",
      "Line direction: standing at a line's first point and facing its second, an object crossing from your " +
      "right to your left counts \"in\" (the arrow points to that side), the other way \"out\". An object " +
      "counts once its whole box has passed. A zone counts the objects whose box's bottom centre is inside it.",
      "muted direction");
    this.errors = element("div", undefined, "error edit-error");
    this.table = element("table", undefined, "shapes");
    const head = element("tr");
    for (const title of ["Name", "Kind", "Points (frame pixels)", "Counts per class", ""]) {
      head.append(element("th", title));
    }
    this.table.append(element("thead"), element("tbody"));
    this.table.tHead.append(head);
    card.append(this.frameSize, this.frame, tools, this.hint, this.errors, this.table, this.direction);
    this.svg.addEventListener("pointerdown", (event) => this.pointerDown(event));
    this.svg.addEventListener("pointermove", (event) => this.pointerMove(event));
    this.svg.addEventListener("pointerup", () => this.pointerUp());
    this.svg.addEventListener("pointercancel", () => {
      this.gesture = null;
      this.render();
    });
    this.svg.addEventListener("keydown", (event) => this.key(event));
  }

  button(label, action, className) {
    const node = element("button", label, className);
    node.type = "button";
    node.addEventListener("click", action);
    return node;
  }

  // -- what the server says ------------------------------------------------------------------------
  setFrameSize(width, height) {
    if (this.size && this.size[0] === width && this.size[1] === height) return;
    this.size = [width, height];
    this.frameSize.textContent = `frame: ${width} × ${height} px (coordinates are in these pixels)`;
    this.frame.style.aspectRatio = `${width} / ${height}`;
    this.svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    this.render();
  }

  // The stream as GET /v1/streams listed it, fetched at `fetchedAt` (ms): followed unless the operator
  // has unapplied changes, or the listing is older than the last Apply.
  sync(info, fetchedAt) {
    this.counts = info.counts;
    if (!this.dirty && !this.gesture && !this.pendingZone && fetchedAt >= this.appliedAt) {
      this.adopt(info);
    }
    this.renderTable();
  }

  adopt(info) {
    this.saved = { ...copyShapes(info.lines, info.zones), track: info.track };
    this.draft = copyShapes(info.lines, info.zones);
    this.track = info.track;
    if (this.selected && !this.draft[this.selected.kind][this.selected.index]) this.selected = null;
    this.render();
  }

  // -- editing ------------------------------------------------------------------------------------
  setMode(mode) {
    this.mode = mode;
    this.pendingZone = null;
    this.render();
  }

  changed() {
    this.dirty = true;
    this.showErrors([]); // they were about what the operator just changed
    this.render();
  }

  freeName(prefix) {
    const taken = new Set([...this.draft.lines, ...this.draft.zones].map((s) => s.name));
    for (let i = 1; ; i++) if (!taken.has(`${prefix}-${i}`)) return `${prefix}-${i}`;
  }

  deleteSelected() {
    if (!this.selected) return;
    this.draft[this.selected.kind].splice(this.selected.index, 1);
    this.selected = null;
    this.changed();
  }

  finishZone() {
    if (!this.pendingZone || this.pendingZone.length < 3) {
      this.showErrors(["a zone needs at least 3 corners"]);
      return;
    }
    this.draft.zones.push({ name: this.freeName("zone"), polygon: this.pendingZone });
    this.selected = { kind: "zones", index: this.draft.zones.length - 1 };
    this.pendingZone = null;
    this.mode = "select";
    this.changed();
  }

  discard() {
    this.dirty = false;
    this.pendingZone = null;
    this.showErrors([]);
    this.adopt(this.saved);
  }

  async apply() {
    const body = { lines: this.draft.lines, zones: this.draft.zones, track: this.track };
    this.applyButton.disabled = true;
    try {
      const response = await this.request(`/v1/streams/${encodeURIComponent(this.name)}`, {
        method: "PATCH",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      if (!response.ok) {
        this.showErrors(describeProblem((await response.json()).detail));
        return;
      }
      const info = await response.json();
      this.appliedAt = Date.now();
      this.dirty = false;
      this.showErrors([]);
      this.adopt(info);
      this.counts = info.counts;
      this.renderTable();
      this.pending.textContent = "applied: what you changed counts from zero, the rest counts on";
    } catch (failure) {
      this.showErrors([`not applied: ${failure.message}`]);
    } finally {
      this.applyButton.disabled = false;
    }
  }

  showErrors(sentences) {
    this.errors.replaceChildren(...sentences.map((s) => element("div", s)));
  }

  // -- the mouse ------------------------------------------------------------------------------------
  scale() {
    const box = this.svg.getBoundingClientRect();
    return this.size && box.width ? this.size[0] / box.width : 1; // frame pixels per screen pixel
  }

  toFrame(event) {
    const box = this.svg.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * this.size[0];
    const y = ((event.clientY - box.top) / box.height) * this.size[1];
    const clamp = (value, limit) => Math.round(Math.min(Math.max(value, 0), limit));
    return [clamp(x, this.size[0]), clamp(y, this.size[1])];
  }

  pointerDown(event) {
    if (!this.size || event.button !== 0) return;
    event.preventDefault();
    this.svg.focus();
    const point = this.toFrame(event);
    if (this.mode === "line") {
      this.gesture = { type: "new-line", start: point, end: point };
    } else if (this.mode === "zone") {
      const corners = this.pendingZone || [];
      const first = corners[0];
      const near = first && Math.hypot(first[0] - point[0], first[1] - point[1]) <= 2 * HANDLE_PX * this.scale();
      if (near && corners.length >= 3) return this.finishZone();
      this.pendingZone = [...corners, point];
    } else {
      const target = event.target.dataset || {};
      if (target.kind) {
        this.selected = { kind: target.kind, index: Number(target.index) };
        const shape = this.draft[target.kind][Number(target.index)];
        const handle = target.point === undefined ? null : target.point;
        this.gesture = { type: "move", handle, last: point, original: JSON.stringify(shape) };
      } else {
        this.selected = null;
      }
    }
    this.svg.setPointerCapture(event.pointerId);
    this.render();
  }

  pointerMove(event) {
    if (!this.size) return;
    this.pointer = this.toFrame(event);
    const gesture = this.gesture;
    if (gesture && gesture.type === "new-line") gesture.end = this.pointer;
    if (gesture && gesture.type === "move") this.moveSelected(gesture, this.pointer);
    if (gesture || this.pendingZone) this.render();
  }

  pointerUp() {
    const gesture = this.gesture;
    this.gesture = null;
    if (!gesture) return;
    if (gesture.type === "new-line") {
      const length = Math.hypot(gesture.end[0] - gesture.start[0], gesture.end[1] - gesture.start[1]);
      if (length / this.scale() >= MIN_LINE_PX) {
        this.draft.lines.push({ name: this.freeName("line"), start: gesture.start, end: gesture.end });
        this.track = true; // lines count tracked objects (the server refuses a line on an untracked stream)
        this.selected = { kind: "lines", index: this.draft.lines.length - 1 };
        this.mode = "select";
        this.changed();
        return;
      }
    } else if (gesture.type === "move") {
      const shape = this.draft[this.selected.kind][this.selected.index];
      if (JSON.stringify(shape) !== gesture.original) this.changed();
    }
    this.render();
  }

  // Moves one point (a handle) or, from the body, every point of the selected shape, kept on the frame.
  moveSelected(gesture, point) {
    const shape = this.draft[this.selected.kind][this.selected.index];
    const points = this.selected.kind === "lines" ? [shape.start, shape.end] : shape.polygon;
    if (gesture.handle !== null) {
      const p = points[Number(gesture.handle)];
      [p[0], p[1]] = point;
      return;
    }
    let dx = point[0] - gesture.last[0];
    let dy = point[1] - gesture.last[1];
    for (const [x, y] of points) {
      dx = Math.min(Math.max(dx, -x), this.size[0] - x);
      dy = Math.min(Math.max(dy, -y), this.size[1] - y);
    }
    for (const p of points) {
      p[0] += dx;
      p[1] += dy;
    }
    gesture.last = [gesture.last[0] + dx, gesture.last[1] + dy];
  }

  key(event) {
    if ((event.key === "Delete" || event.key === "Backspace") && this.selected) {
      event.preventDefault();
      this.deleteSelected();
    } else if (event.key === "Escape") {
      this.gesture = null;
      this.setMode("select");
    } else if (event.key === "Enter" && this.pendingZone) {
      this.finishZone();
    }
  }

  // -- drawing ------------------------------------------------------------------------------------
  render() {
    for (const [mode, button] of Object.entries(this.buttons)) button.classList.toggle("active", mode === this.mode);
    this.finishButton.hidden = this.mode !== "zone";
    this.deleteButton.disabled = !this.selected;
    this.discardButton.disabled = !this.dirty;
    this.trackBox.checked = this.track;
    this.svg.classList.toggle("drawing", this.mode !== "select");
    this.hint.textContent = this.size ? HINTS[this.mode] : "Drawing starts once the first frame gives the frame size.";
    const unappliedNote = "not applied yet: Apply restarts only what you changed";
    if (this.dirty) this.pending.textContent = unappliedNote;
    else if (this.pending.textContent === unappliedNote) this.pending.textContent = "";
    this.svg.replaceChildren();
    if (this.size) this.drawShapes();
    this.renderTable();
  }

  drawShapes() {
    const s = this.scale();
    const [width, height] = this.size;
    this.svg.append(svgElement("rect", { class: "backdrop", width, height }));
    this.draft.zones.forEach((zone, index) => {
      const selected = this.isSelected("zones", index);
      const points = zone.polygon.map((p) => p.join(",")).join(" ");
      const className = `zone${selected ? " selected" : ""}`;
      this.svg.append(svgElement("polygon", { class: className, points, "data-kind": "zones", "data-index": index }));
      if (this.unapplied("zones", zone)) this.label(zone.name, zone.polygon[0], s);
      zone.polygon.forEach((p, i) => this.handle(p, "zones", index, i, s));
    });
    this.draft.lines.forEach((line, index) => {
      const selected = this.isSelected("lines", index);
      const ends = { x1: line.start[0], y1: line.start[1], x2: line.end[0], y2: line.end[1] };
      this.svg.append(svgElement("line", { ...ends, class: `line${selected ? " selected" : ""}` }));
      this.svg.append(svgElement("line", { ...ends, class: "hit", "data-kind": "lines", "data-index": index }));
      this.arrow(line, s);
      if (this.unapplied("lines", line)) this.label(line.name, line.start, s);
      this.handle(line.start, "lines", index, 0, s);
      this.handle(line.end, "lines", index, 1, s);
    });
    const gesture = this.gesture;
    if (gesture && gesture.type === "new-line") {
      const [x1, y1] = gesture.start;
      const [x2, y2] = gesture.end;
      this.svg.append(svgElement("line", { x1, y1, x2, y2, class: "line drafting" }));
      if (x1 !== x2 || y1 !== y2) this.arrow(gesture, s);
    }
    if (this.pendingZone) {
      const corners = this.pointer ? [...this.pendingZone, this.pointer] : this.pendingZone;
      const points = corners.map((p) => p.join(",")).join(" ");
      this.svg.append(svgElement("polyline", { class: "zone drafting", points }));
      for (const [cx, cy] of this.pendingZone) {
        this.svg.append(svgElement("circle", { class: "handle", cx, cy, r: HANDLE_PX * s }));
      }
    }
  }

  // Whether the running stream lacks this shape as drawn (the annotated frame names applied ones).
  unapplied(kind, shape) {
    const same = JSON.stringify(shape);
    return !this.saved[kind].some((s) => JSON.stringify(s) === same);
  }

  isSelected(kind, index) {
    return this.selected !== null && this.selected.kind === kind && this.selected.index === index;
  }

  handle(point, kind, index, pointIndex, s) {
    this.svg.append(svgElement("circle", {
      class: "handle", cx: point[0], cy: point[1], r: HANDLE_PX * s,
      "data-kind": kind, "data-index": index, "data-point": pointIndex,
    }));
  }

  label(text, at, s) {
    const node = svgElement("text", { class: "label", x: at[0] + 8 * s, y: at[1] + 16 * s, "font-size": 12 * s });
    node.textContent = text;
    this.svg.append(node);
  }

  arrow(line, s) {
    const [nx, ny] = inDirection(line.start, line.end);
    const mx = (line.start[0] + line.end[0]) / 2;
    const my = (line.start[1] + line.end[1]) / 2;
    const tip = [mx + nx * ARROW_PX * s, my + ny * ARROW_PX * s];
    this.svg.append(svgElement("line", { class: "arrow", x1: mx, y1: my, x2: tip[0], y2: tip[1] }));
    const head = 7 * s; // the arrowhead: two corners back from the tip, either side of the shaft
    const corners = [-1, 1].map((side) => [
      tip[0] - nx * head - ny * head * side * 0.6,
      tip[1] - ny * head + nx * head * side * 0.6,
    ]);
    const points = [tip, ...corners].map((p) => p.join(",")).join(" ");
    this.svg.append(svgElement("polygon", { class: "arrow-head", points }));
    const at = { x: tip[0] + nx * 4 * s, y: tip[1] + ny * 4 * s + 4 * s };
    const node = svgElement("text", { class: "arrow-label", ...at, "font-size": 11 * s });
    node.textContent = "in";
    this.svg.append(node);
  }

  renderTable() {
    const body = this.table.tBodies[0];
    // a row whose name field has the focus stays, so typing a name is not interrupted by a refresh
    if (body.contains(document.activeElement)) return;
    const rows = [];
    const counts = this.counts || { lines: {}, zones: {} };
    for (const kind of ["lines", "zones"]) {
      this.draft[kind].forEach((shape, index) => {
        const row = element("tr");
        row.dataset.shape = shape.name;
        row.classList.toggle("selected", this.isSelected(kind, index));
        const name = element("input");
        name.value = shape.name;
        name.size = 10;
        name.setAttribute("aria-label", "name");
        name.addEventListener("change", () => {
          shape.name = name.value.trim();
          this.changed();
        });
        const points = kind === "lines" ? [shape.start, shape.end] : shape.polygon;
        const text = points.map(([x, y]) => `(${x}, ${y})`).join(kind === "lines" ? " → " : " ");
        const applied = counts[kind] && shape.name in counts[kind]; // a running line or zone of this name
        let countText = "counted once applied";
        if (applied && kind === "lines") countText = describeLineCounts(counts.lines[shape.name]);
        if (applied && kind === "zones") countText = describeZoneCounts(counts.zones[shape.name]);
        const remove = this.button("Delete", () => {
          this.draft[kind].splice(index, 1);
          this.selected = null;
          this.changed();
        });
        const nameCell = element("td");
        nameCell.append(name);
        const removeCell = element("td");
        removeCell.append(remove);
        row.append(nameCell, element("td", kind === "lines" ? "line" : "zone"), element("td", text, "points"),
          element("td", countText, "shape-counts"), removeCell);
        rows.push(row);
      });
    }
    body.replaceChildren(...rows);
    this.table.hidden = rows.length === 0;
  }
}
