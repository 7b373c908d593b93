// Caravan's web UI, its drawings: line charts of the series the agent samples itself (an
// alloc's CPU and memory, a job's allocs by status) and the topology of the cluster's nodes.
// Loaded before app.js, whose helpers (el, fill, api, ...) these call once the page runs.
//
// Drawn as SVG from numbers only; every name shown (a node, a job, an alloc) is set as text.
// Colours come from classes in style.css (the page's policy allows no inline style), and
// every chart says its latest values in words as well.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHART_WIDTH = 600;
const CHART_HEIGHT = 120;
const TOPOLOGY_SQUARES = 400;

function svg(tag, attributes, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  for (const child of children.flat(Infinity)) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/**
 * A line chart of `series` (each `{ name, cls, points: [[unixMs, value], ...] }`) over the
 * sampled window, with `format` for values. Its figure caption and legend say the latest
 * values; an empty series draws nothing and says it is waiting for samples.
 */
function lineChart(title, series, format, id) {
  const points = series.flatMap((s) => s.points);
  if (points.length < 2) {
    return el("figure", { class: "chart", id }, el("figcaption", {}, title),
      el("p", { class: "muted" }, "Waiting for samples: the agent takes one every few seconds."));
  }
  const times = points.map(([at]) => at);
  const [first, last] = [Math.min(...times), Math.max(...times)];
  const top = Math.max(...points.map(([, value]) => value), 0) || 1;
  const x = (at) => ((at - first) / Math.max(last - first, 1)) * CHART_WIDTH;
  const y = (value) => CHART_HEIGHT - (value / top) * (CHART_HEIGHT - 4) - 2;
  const latest = series.map((s) => `${s.name} ${s.points.length ? format(s.points[s.points.length - 1][1]) : "none"}`);
  const drawing = svg("svg", {
    viewBox: `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`, preserveAspectRatio: "none", class: "chart-area", role: "img",
    "aria-label": `${title}: ${latest.join(", ")}`,
  },
  svg("line", { x1: 0, y1: CHART_HEIGHT - 1, x2: CHART_WIDTH, y2: CHART_HEIGHT - 1, class: "axis" }),
  series.filter((s) => s.points.length).map((s) => svg("polyline", {
    class: `line ${s.cls}`, "data-series": s.name,
    points: s.points.map(([at, value]) => `${x(at).toFixed(1)},${y(value).toFixed(1)}`).join(" "),
  })));
  const span = Math.round((last - first) / 60000);
  return el("figure", { class: "chart", id },
    el("figcaption", {}, title, el("span", { class: "muted" }, ` (top ${format(top)}; the last ${span || "<1"} min)`)),
    drawing,
    el("p", { class: "legend" }, series.map((s, i) => el("span", { class: `key ${s.cls}` }, latest[i]))));
}

/** An alloc's CPU and memory, as its node's agent sampled them. */
function usageCharts(usage) {
  const samples = usage.samples || [];
  if (usage.note) return el("p", { class: "muted" }, usage.note);
  return [
    lineChart("CPU", [{ name: "CPU", cls: "s1", points: samples.map((s) => [s.at_unix_ms, s.cpu_percent]) }],
      (v) => `${v.toFixed(1)}%`, "chart-cpu"),
    lineChart("Memory", [{ name: "memory", cls: "s2", points: samples.map((s) => [s.at_unix_ms, s.memory_bytes]) }],
      bytes, "chart-memory"),
  ];
}

/** A job's allocs by status over time, as the scheduling agent sampled them. */
function jobChart(series) {
  const samples = series.samples || [];
  const line = (name, cls, key) => ({ name, cls, points: samples.map((s) => [s.at_unix_ms, s[key]]) });
  return lineChart("Allocations over time", [
    line("placed", "s1", "placed"), line("running", "s3", "running"),
    line("failed", "s4", "failed"), line("rescheduled", "s2", "rescheduled"),
  ], (v) => String(Math.round(v)), "chart-job");
}

// ---- the topology page: every node, its memory and its allocs ----

function topologyPage() {
  const region = el("section", { "aria-label": "Topology" });
  fill(main, el("h1", {}, "Topology"),
    el("p", { class: "muted" }, "Each node with the memory its allocs reserve, and one square per alloc not yet ended."),
    region);
  return refreshing(region, async (signal) => ({
    nodes: await api("GET", "/v1/nodes", undefined, signal),
    allocs: await api("GET", "/v1/allocations", undefined, signal),
  }), ({ nodes, allocs }) => drawTopology(nodes, allocs));
}

function drawTopology(nodes, allocs) {
  if (!nodes.length) return el("p", { class: "muted" }, "No nodes.");
  const byNode = new Map(nodes.map((node) => [node.id, []]));
  for (const alloc of allocs) {
    if (alloc.node_id && !TERMINAL.includes(alloc.client_status) && byNode.has(alloc.node_id)) {
      byNode.get(alloc.node_id).push(alloc);
    }
  }
  return el("div", { class: "topology" }, nodes.map((node) => {
    const held = byNode.get(node.id);
    const shown = held.slice(0, TOPOLOGY_SQUARES);
    const capacity = node.memory_bytes || 0;
    const reserved = Math.min(node.memory_reserved_bytes || 0, capacity || Infinity);
    const share = capacity ? reserved / capacity : 0;
    return el("article", { class: "node-card", "data-node": node.id },
      el("h3", {}, el("span", { class: "id" }, node.id), " ", statusText(node.status)),
      capacity
        ? [svg("svg", { viewBox: "0 0 300 12", preserveAspectRatio: "none", class: "memory-bar", role: "img",
          "aria-label": `memory: ${mib(reserved)} of ${mib(capacity)} reserved` },
        svg("rect", { x: 0, y: 0, width: 300, height: 12, class: "free" }),
        svg("rect", { x: 0, y: 0, width: (300 * share).toFixed(1), height: 12, class: "reserved" })),
        el("p", { class: "muted" }, `${mib(reserved)} of ${mib(capacity)} reserved, ${mib(capacity - reserved)} free`)]
        : el("p", { class: "muted" }, "Memory not declared."),
      el("div", { class: "squares" }, shown.map((alloc) => el("a", {
        href: `#/alloc/${enc(alloc.id)}`, class: `square status-bg-${alloc.client_status}`,
        title: `${alloc.job_id} ${short(alloc.id)}: ${alloc.client_status}`,
        "aria-label": `alloc ${short(alloc.id)} of ${alloc.job_id}, ${alloc.client_status}`,
      }))),
      el("p", { class: "muted" }, `${held.length} ${held.length === 1 ? "alloc" : "allocs"}` +
        (held.length > shown.length ? ` (the first ${shown.length} drawn)` : "")));
  }));
}
