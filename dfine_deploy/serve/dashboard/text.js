// What the dashboard says: DOM nodes whose text goes in through textContent only, the API's refusals as
// sentences, counts per class. Loaded first; counting.js and dashboard.js use these.
"use strict";

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

// The API's answer to a refused request, in sentences: a string detail as it is; FastAPI's validation
// list (422) as one sentence per field, never the raw JSON.
function describeProblem(detail) {
  if (typeof detail === "string") return [detail];
  if (!Array.isArray(detail)) return ["the server refused the request"];
  const byField = new Map();
  for (const problem of detail) {
    const field = fieldPath(problem.loc || []);
    if (!byField.has(field)) byField.set(field, problemSentence(field, problem));
  }
  return [...byField.values()];
}

function fieldPath(loc) {
  let path = "";
  for (const part of loc) {
    if (part === "body") continue;
    path += typeof part === "number" ? `[${part}]` : path ? `.${part}` : String(part);
  }
  return path || "the request";
}

function problemSentence(field, problem) {
  if (problem.type === "missing") return `${field} is missing.`;
  if (problem.type === "extra_forbidden" || problem.type === "unexpected_keyword_argument") {
    return `${field} is not a known field; check its spelling.`;
  }
  const scalar = problem.input !== undefined && typeof problem.input !== "object";
  const shown = scalar ? ` (got ${JSON.stringify(problem.input)})` : "";
  return `${field}: ${String(problem.msg).replace(/\.$/, "")}${shown}.`;
}

// Per class, as "red-square 2, blue-square 1" (never summed over classes).
function perClass(byClass) {
  const parts = Object.entries(byClass || {}).map(([name, n]) => `${name} ${n}`);
  return parts.length ? parts.join(", ") : "none";
}

function describeLineCounts(crossings) {
  return `in: ${perClass(crossings && crossings.in)}; out: ${perClass(crossings && crossings.out)}`;
}

function describeZoneCounts(inside) {
  return `inside now: ${perClass(inside)}`;
}
