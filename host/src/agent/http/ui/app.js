// Caravan's web UI: four pages (jobs, a job, an alloc, the topology) drawn from the agent's
// JSON API and refreshed every two seconds; the alloc page follows the alloc's log as it is
// written. The charts and the topology are drawn by plots.js.
//
// Everything a page shows from a runner (descriptions, events, log lines, file names) came
// from a guest, so it is only ever set as text, never as HTML. The ACL token is kept for the
// browser tab only (sessionStorage) and sent as `Authorization: Bearer` on every call; the
// page asks the agent what the token may do (`/v1/acl/token/self`) and disables the actions
// its role may not take, and hides the token box on an agent that checks no token.
"use strict";

const REFRESH_MS = 2000;
const LOG_LINES_KEPT = 2000;
const FILE_BYTES_SHOWN = 64 * 1024;
const SIGNALS = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2"];
const TERMINAL = ["complete", "failed", "lost"];

const main = document.getElementById("main");
const notice = document.getElementById("notice");
const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("caravan-token") || "";
tokenForm.addEventListener("submit", (event) => event.preventDefault());
// Asked once typing pauses, not for every partial token (each would be refused).
let roleTimer;
tokenInput.addEventListener("input", () => {
  sessionStorage.setItem("caravan-token", tokenInput.value.trim());
  clearTimeout(roleTimer);
  roleTimer = setTimeout(learnRole, 300);
});

// What the token in use may do: `undefined` until known, `null` on an agent that checks no
// token, else its role ("" for no valid token). Each role has the rights of those before it.
let tokenRole;
let aclMode;
let roleAsked = 0;
const ROLE_RANK = { read: 1, submit: 2, operator: 3, management: 4 };

/** Learns what the agent checks (once) and what the token may do, then enables the actions
 * it may take. Nothing is asked that the agent would refuse: no token, no question. */
async function learnRole() {
  const asked = ++roleAsked;
  const token = tokenInput.value.trim();
  let role;
  try {
    if (aclMode === undefined) aclMode = (await (await fetch("/v1/agent/health")).json()).acl;
    if (aclMode === "off") role = null;
    else if (!token) role = "";
    // The shared token of earlier releases may do everything; the agent says if it is wrong.
    else if (aclMode === "shared_token") role = "management";
    else role = (await api("GET", "/v1/acl/token/self")).role;
  } catch (_) {
    role = "";
  }
  if (asked !== roleAsked) return;
  tokenRole = role;
  tokenForm.hidden = role === null;
  for (const button of document.querySelectorAll("button[data-needs]")) applyRole(button);
}

function allowed(needs) {
  return tokenRole === null || tokenRole === undefined || (ROLE_RANK[tokenRole] || 0) >= ROLE_RANK[needs];
}

function applyRole(button) {
  const ok = allowed(button.dataset.needs);
  button.disabled = !ok;
  button.title = ok ? "" : `needs a token with role ${button.dataset.needs} or above`;
}

// ---- helpers ----

/** An element with attributes (`class`, `href`, ... or `on*` handlers) and children as text. */
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replaces `node`'s children with `content`: a node, text, or (nested) lists of them. */
function fill(node, ...content) {
  node.replaceChildren(...content.flat(Infinity).filter((c) => c !== undefined && c !== null)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
}

function say(message, isError) {
  notice.textContent = message || "";
  notice.className = isError ? "error" : "";
}

/** Calls the agent's API; throws an Error carrying the API's own message on a refusal. */
async function request(method, path, body, signal) {
  const headers = {};
  const token = tokenInput.value.trim();
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    const refusal = await response.json().catch(() => ({}));
    const error = new Error(refusal.error || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return response;
}

/** [request] for a JSON answer. */
async function api(method, path, body, signal) {
  return (await request(method, path, body, signal)).json();
}

const short = (id) => String(id).slice(0, 8);
const enc = encodeURIComponent;

function statusText(status) {
  return el("span", { class: `status status-${status}` }, status);
}

/** `at` as the CLI prints times: local date and time to the second, and the zone's offset
 * from UTC (`2026-12-01 23:41:07 +01:00`), whatever the browser's locale. */
function timeText(at) {
  const pad = (n) => String(n).padStart(2, "0");
  const offset = -at.getTimezoneOffset();
  const sign = offset < 0 ? "-" : "+";
  const hours = pad(Math.floor(Math.abs(offset) / 60)), minutes = pad(Math.abs(offset) % 60);
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ` +
    `${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())} ${sign}${hours}:${minutes}`;
}

function localTime(unixMs) {
  const at = new Date(unixMs);
  if (!unixMs || Number.isNaN(at.getTime())) return "";
  return el("time", { datetime: at.toISOString(), title: at.toISOString() }, timeText(at));
}

/** When the alloc's client received it: its first task event (undefined before any). */
function receivedAt(alloc) {
  const times = (alloc.task_states || []).flatMap((task) => (task.events || []).map((e) => e.time_unix_ms))
    .filter((t) => t > 0);
  return times.length ? Math.min(...times) : undefined;
}

/** How long ago `unixMs` was, as `45s`, `3m12s` or `2h5m`. */
function age(unixMs) {
  if (!unixMs) return "";
  const s = Math.max(0, Math.round((Date.now() - unixMs) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60}s`;
  return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
}

function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

function byStatus(counts) {
  const parts = Object.entries(counts || {}).map(([status, n]) => `${n} ${status}`);
  return parts.length ? parts.join(", ") : "none";
}

function table(headings, rows, empty) {
  if (!rows.length) return el("p", { class: "muted" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
}

function facts(pairs) {
  return el("dl", {}, pairs.filter(([, value]) => value !== undefined && value !== null && value !== "")
    .map(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
}

/** A button that runs `action`, then says what happened; `confirmText` asks for a second
 * click. It is enabled only while the token's role is at least `needs`. */
function actionButton(label, needs, action, { danger, confirmText } = {}) {
  let armed = false;
  const button = el("button", { type: "button", class: danger ? "danger" : undefined, "data-needs": needs });
  button.textContent = label;
  applyRole(button);
  button.addEventListener("click", async () => {
    if (confirmText && !armed) {
      armed = true;
      button.textContent = confirmText;
      button.classList.add("confirm");
      return;
    }
    armed = false;
    button.textContent = label;
    button.classList.remove("confirm");
    button.disabled = true;
    try {
      say(await action(), false);
    } catch (error) {
      say(`${label} failed: ${error.message}`, true);
    } finally {
      applyRole(button);
    }
  });
  button.addEventListener("blur", () => {
    if (!armed) return;
    armed = false;
    button.textContent = label;
    button.classList.remove("confirm");
  });
  return button;
}

/**
 * A page that redraws `region` from `load()` every REFRESH_MS until the route changes.
 * Returns the page's `stop`, which the router calls before drawing the next page.
 */
function refreshing(region, load, draw, cleanups) {
  const controller = new AbortController();
  let timer = null;
  async function tick() {
    try {
      const data = await load(controller.signal);
      if (controller.signal.aborted) return;
      fill(region, draw(data));
      if (notice.className === "error" && notice.dataset.source === "refresh") say("");
    } catch (error) {
      if (controller.signal.aborted) return;
      say(`Cannot load this page: ${error.message}`, true);
      notice.dataset.source = "refresh";
    }
    timer = setTimeout(tick, REFRESH_MS);
  }
  tick();
  return () => {
    controller.abort();
    clearTimeout(timer);
    for (const cleanup of cleanups || []) cleanup();
  };
}

// ---- the jobs page ----

function jobsPage() {
  const jobs = el("section", { "aria-label": "Jobs" });
  const gc = el("section", { "aria-labelledby": "gc-heading" });
  const nodes = el("section", { "aria-label": "Nodes" });
  fill(main, el("h1", {}, "Jobs"), jobs,
    el("h2", { id: "gc-heading" }, "Garbage collection"), gc,
    el("div", { class: "actions" },
      actionButton("Collect terminal allocs on this node", "operator", async () => {
        await api("POST", "/v1/client/gc");
        return "Collected every terminal alloc on this node.";
      }),
      actionButton("Run the server's GC", "operator", async () => {
        await api("PUT", "/v1/system/gc");
        return "The server's GC ran.";
      })),
    el("h2", {}, "Nodes"), nodes);
  return refreshing(jobs, async (signal) => ({
    jobs: await api("GET", "/v1/jobs", undefined, signal),
    gc: await api("GET", "/v1/client/gc", undefined, signal),
    nodes: await api("GET", "/v1/nodes", undefined, signal),
  }), (data) => {
    fill(gc, drawGc(data.gc));
    fill(nodes, drawNodes(data.nodes));
    return table(["Job", "Namespace", "Type", "Status", "Version", "Count", "Allocs", "Recovery"],
      data.jobs.map((job) => [
        el("a", { href: `#/job/${enc(job.id)}` }, job.id), job.namespace || "default", job.type,
        statusText(job.status), job.version, job.count, byStatus(job.allocs), job.recovery || "",
      ]),
      "No jobs yet. Run one with: caravan job run FILE");
  });
}

function drawGc(gc) {
  const skip = gc.last_skip;
  return facts([
    ["Marked, waiting", gc.marked],
    ["Destroying", `${gc.destroying.length} of at most ${gc.parallel_destroys}` +
      (gc.destroying.length ? `: ${gc.destroying.map(short).join(", ")}` : "")],
    ["Limits", `${gc.max_allocs} allocs, disk ${gc.disk_usage_threshold}%, ` +
      `inodes ${gc.inode_usage_threshold}%, a pass every ${gc.interval_secs} s`],
    ["Passes", gc.passes],
    ["Last skip", skip ? el("span", {}, el("span", { class: `status status-${skip.level === "warn" ? "failed" : "pending"}` },
      skip.level.toUpperCase()), ` ${skip.reason}, `, localTime(skip.at_unix_ms)) : "none"],
  ]);
}

function drawNodes(nodes) {
  return table(["Node", "Status", "Eligibility", "Class", "Allocs not terminal", "Memory reserved", "Address"],
    nodes.map((node) => [
      el("span", { class: "id" }, node.id), statusText(node.status),
      node.drain ? `draining (${node.allocs} left${node.drain.deadline_unix_ms ? ", deadline " + timeText(new Date(node.drain.deadline_unix_ms)) : ""})` : (node.eligibility || ""),
      node.class || "",
      node.alloc_slots ? `${node.allocs} of ${node.alloc_slots}` : node.allocs,
      node.memory_bytes ? `${mib(node.memory_reserved_bytes)} of ${mib(node.memory_bytes)}` : "",
      node.address || "",
    ]), "No nodes.");
}

function mib(bytes) {
  return `${Math.round((bytes || 0) / 1048576)} MiB`;
}

/** Why a job's allocs wait for a node, as `job status` says it. */
function blockedText(blocked) {
  if (!blocked) return "";
  return `${blocked.allocs} ${blocked.allocs === 1 ? "alloc" : "allocs"} not placed: ${blocked.reason}`;
}

// ---- a job's page ----

function jobPage(jobId) {
  const summary = el("section", { "aria-label": "Job" });
  const tasks = el("section", { "aria-labelledby": "tasks-heading", id: "job-tasks" });
  const allocs = el("section", { "aria-labelledby": "allocs-heading" });
  const history = el("section", { "aria-label": "Allocations over time", id: "job-history" });
  const count = el("input", { type: "number", min: 0, max: 100000, id: "scale-count" });
  fill(main, el("h1", {}, "Job ", el("span", { class: "id" }, jobId)), summary,
    el("div", { class: "actions" },
      el("label", { for: "scale-count" }, "Count"), count,
      actionButton("Scale", "submit", async () => {
        const answer = await api("POST", `/v1/job/${enc(jobId)}/scale`, { count: Number(count.value) });
        return `Scaled ${jobId}: ${answer.placed} placed, ${answer.stopped} stopped.`;
      }),
      actionButton("Stop job", "submit", async () => {
        await api("DELETE", `/v1/job/${enc(jobId)}`);
        return `Stopped ${jobId}.`;
      }, { danger: true, confirmText: "Yes, stop the job" })),
    el("h2", { id: "tasks-heading" }, "Tasks"), tasks, history,
    el("h2", { id: "allocs-heading" }, "Allocations"), allocs);
  return refreshing(summary, async (signal) => ({
    job: await api("GET", `/v1/job/${enc(jobId)}`, undefined, signal),
    allocs: await api("GET", `/v1/job/${enc(jobId)}/allocations`, undefined, signal),
    series: await api("GET", `/v1/job/${enc(jobId)}/series`, undefined, signal).catch(() => undefined),
  }), ({ job, allocs: list, series }) => {
    fill(history, series ? jobChart(series) : "");
    if (document.activeElement !== count) count.value = job.count;
    fill(tasks, table(["Task", "Config"], (job.tasks || []).map((task) => [
      task.name,
      Object.entries(task.config).map(([key, value]) => el("span", { class: "limit" }, `${key} = ${value}`)),
    ]), "No tasks."));
    fill(allocs, drawAllocsByStatus(list));
    return facts([
      ["Status", statusText(job.status)], ["Type", job.type], ["Version", job.version],
      ["Count", job.count], ["Allocs", byStatus(job.allocs)], ["Runner", el("code", {}, job.runner)],
      ["Recovery", job.recovery], ["Placement", blockedText(job.blocked)],
    ]);
  });
}

function drawAllocsByStatus(allocs) {
  if (!allocs.length) return el("p", { class: "muted" }, "No allocations.");
  const order = ["running", "pending", "failed", "complete", "lost"];
  const groups = new Map();
  for (const alloc of allocs) {
    if (!groups.has(alloc.client_status)) groups.set(alloc.client_status, []);
    groups.get(alloc.client_status).push(alloc);
  }
  const statuses = [...groups.keys()].sort((a, b) => order.indexOf(a) - order.indexOf(b));
  return statuses.map((status) => [
    el("h3", {}, statusText(status), ` (${groups.get(status).length})`),
    table(["Alloc", "Desired", "Node", "Version", "Age", "Description"], groups.get(status).map((alloc) => [
      el("a", { href: `#/alloc/${enc(alloc.id)}`, class: "id" }, short(alloc.id)),
      alloc.desired_status, alloc.node_id ? short(alloc.node_id) : "", alloc.job_version,
      age(receivedAt(alloc)), alloc.description,
    ]), ""),
  ]);
}

// ---- an alloc's page ----

function allocPage(allocId) {
  const summary = el("section", { "aria-label": "Allocation" });
  const tasks = el("section", { "aria-labelledby": "tasks-heading" });
  const usage = el("section", { "aria-labelledby": "usage-heading", id: "alloc-usage" });
  const log = el("pre", { role: "log", "aria-label": "Log", id: "alloc-log", tabindex: 0 });
  const logState = el("p", { class: "muted", id: "log-state" });
  const files = el("details", { id: "files" }, el("summary", {}, "Files"));
  const signalChoice = el("select", { id: "signal-name" }, SIGNALS.map((s) => el("option", {}, s)));
  signalChoice.value = "SIGUSR1";
  const id = () => main.dataset.allocId || allocId;
  // What the agent would refuse is not offered: a running alloc is restarted or signalled, a
  // running or pending one stopped, an ended one collected; nothing before its state is known.
  const whileRunning = [
    actionButton("Restart", "operator", async () => {
      await api("POST", `/v1/client/allocation/${enc(id())}/restart`);
      return "Restarting its tasks.";
    }),
    el("label", { for: "signal-name" }, "Signal"), signalChoice,
    actionButton("Send", "operator", async () => {
      await api("POST", `/v1/client/allocation/${enc(id())}/signal`, { signal: signalChoice.value });
      return `Sent ${signalChoice.value}.`;
    }),
  ];
  const untilEnded = [
    actionButton("Stop alloc", "operator", async () => {
      await api("POST", `/v1/allocation/${enc(id())}/stop`);
      return "Stopping it; the scheduler places a replacement if its job still wants one.";
    }, { danger: true, confirmText: "Yes, stop the alloc" }),
  ];
  const onceEnded = [
    actionButton("Collect", "operator", async () => {
      await api("POST", `/v1/client/allocation/${enc(id())}/gc`);
      return "Collected.";
    }),
  ];
  const offerFor = (status) => {
    const ended = TERMINAL.includes(status);
    for (const node of whileRunning) node.hidden = status !== "running";
    for (const node of untilEnded) node.hidden = status === undefined || ended;
    for (const node of onceEnded) node.hidden = !ended;
  };
  offerFor(undefined);
  fill(main, el("h1", {}, "Allocation ", el("span", { class: "id" }, short(allocId))), summary,
    el("div", { class: "actions" }, whileRunning, untilEnded, onceEnded),
    el("h2", { id: "usage-heading" }, "Usage"), usage,
    el("h2", { id: "tasks-heading" }, "Tasks"), tasks,
    el("h2", {}, "Log"), logState, log, files);
  const stopLog = followLog(allocId, log, logState);
  const stopFiles = browseFiles(allocId, files);
  let noLocalView = false;
  const load = async (signal) => {
    const alloc = await api("GET", `/v1/allocation/${enc(allocId)}`, undefined, signal);
    if (!alloc.local && alloc.node_id && !noLocalView) {
      // In a cluster, what only the alloc's own node knows comes from that node's agent;
      // asked once more only if it answered (a collected alloc has no view there).
      alloc.local = await api("GET", `/v1/client/allocation/${enc(alloc.id)}`, undefined, signal)
        .catch(() => { noLocalView = true; return undefined; });
    }
    // Sampled by the agent of the alloc's node (this one, or the one the request goes to).
    alloc.usage = noLocalView ? undefined : await api("GET", `/v1/client/allocation/${enc(alloc.id)}/usage`,
      undefined, signal).catch(() => undefined);
    return alloc;
  };
  return refreshing(summary, load, (alloc) => {
    main.dataset.allocId = alloc.id;
    offerFor(alloc.client_status);
    fill(usage, alloc.usage ? usageCharts(alloc.usage) : el("p", { class: "muted" }, "No samples: its node does not hold it."));
    fill(tasks, drawTasks(alloc.task_states));
    return drawAlloc(alloc);
  }, [stopLog, stopFiles]);
}

function drawAlloc(alloc) {
  const local = alloc.local || {};
  const replaces = alloc.reschedule;
  return [
    facts([
      ["ID", el("span", { class: "id" }, alloc.id)],
      ["Job", el("a", { href: `#/job/${enc(alloc.job_id)}` }, alloc.job_id)],
      ["Job version", alloc.job_version], ["Node", el("span", { class: "id" }, alloc.node_id || "not placed")],
      ["Runner", [el("code", {}, alloc.runner),
        local.runner_sha256 ? ` (sha256 ${local.runner_sha256.slice(0, 12)})` : ""]],
      ["Desired", alloc.desired_status], ["Client status", statusText(alloc.client_status)],
      ["Received", receivedAt(alloc) ? [localTime(receivedAt(alloc)), ` (${age(receivedAt(alloc))} ago)`] : ""],
      ["Description", alloc.description],
      ["Replaces", replaces ? el("span", {}, el("a", { href: `#/alloc/${enc(replaces.previous_alloc_id)}`, class: "id" },
        short(replaces.previous_alloc_id)), ` (reschedule ${replaces.attempt}, not before `,
      localTime(replaces.start_after_unix_ms), ")") : ""],
      ["Alloc dir", local.alloc_dir ? el("code", {}, local.alloc_dir) : ""],
      ["CPU used", local.cpu_used_us !== undefined ? `${(local.cpu_used_us / 1e6).toFixed(3)} s` : ""],
      ["Memory peak", bytes(local.memory_peak_bytes)],
      ["Last upgrade", local.upgrade ? upgradeText(local.upgrade) : ""],
      ["Limits", (local.limits || []).map(([key, value]) => el("span", {
        class: (local.limits_changed || []).includes(key) ? "limit changed" : "limit",
        title: (local.limits_changed || []).includes(key) ? "set by its job" : "this agent's default",
      }, `${key} ${value}`))],
    ]),
  ];
}

/** `done: 1f2e3d4c5b6a -> 9a8b7c6d5e4f`, and why when it failed: all text, never markup. */
function upgradeText(upgrade) {
  const build = (text) => (/^[0-9a-f]{64}$/.test(text) ? text.slice(0, 12) : text);
  const line = `${upgrade.status.replace("_", " ")}: ${build(upgrade.from_sha256)} -> ${build(upgrade.to)}`;
  return [line, " (asked ", localTime(upgrade.asked_unix_ms), ")", upgrade.reason ? `: ${upgrade.reason}` : ""];
}

function drawTasks(states) {
  if (!states.length) return el("p", { class: "muted" }, "No task has reported yet.");
  return states.map((task) => [
    el("h3", {}, `Task ${task.name}: `, statusText(task.state), task.failed ? " (failed)" : "",
      task.restarts ? `, ${task.restarts} restarts` : ""),
    table(["Time", "Type", "Description"], [...task.events].reverse()
      .map((event) => [localTime(event.time_unix_ms), event.kind, event.message]), "No events."),
  ]);
}

/** Streams the alloc's log into `pre`, keeping the last LOG_LINES_KEPT lines. */
function followLog(allocId, pre, state) {
  const controller = new AbortController();
  let lines = [""];
  let drawPending = false;
  function draw() {
    drawPending = false;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = lines.join("\n");
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
  (async () => {
    state.textContent = "Following the log as it is written.";
    try {
      const response = await request("GET", `/v1/client/allocation/${enc(allocId)}/logs?follow=true`,
        undefined, controller.signal);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const parts = value.split("\n");
        lines[lines.length - 1] += parts[0];
        lines.push(...parts.slice(1));
        if (lines.length > LOG_LINES_KEPT) lines = lines.slice(-LOG_LINES_KEPT);
        if (!drawPending) { drawPending = true; requestAnimationFrame(draw); }
      }
      state.textContent = "The alloc has stopped: this is the whole log.";
    } catch (error) {
      if (!controller.signal.aborted) state.textContent = `The log cannot be followed: ${error.message}`;
    }
  })();
  return () => controller.abort();
}

/** The alloc's files, listed when the operator opens them (reading them needs the token). */
function browseFiles(allocId, details) {
  const controller = new AbortController();
  const body = el("div", {});
  details.append(body);
  async function show(path) {
    try {
      const listing = await api("GET", `/v1/client/fs/ls/${enc(allocId)}?path=${enc(path)}`, undefined, controller.signal);
      if (listing.kind === "file") {
        const file = await request("GET", `/v1/client/fs/cat/${enc(allocId)}?path=${enc(path)}`, undefined, controller.signal);
        const shown = await file.text();
        fill(body, crumbs(path),
          el("pre", { tabindex: 0 }, shown.slice(0, FILE_BYTES_SHOWN)),
          shown.length > FILE_BYTES_SHOWN ? el("p", { class: "muted" }, `The first ${FILE_BYTES_SHOWN} characters; caravan alloc fs shows the rest.`) : "");
        return;
      }
      const prefix = path === "." ? "" : `${path}/`;
      fill(body, crumbs(path), table(["Name", "Kind", "Size", "Modified"], listing.entries.map((entry) => [
        entry.kind === "file" || entry.kind === "dir"
          ? el("button", { type: "button", class: "link-button", onclick: () => show(prefix + entry.name) }, entry.name)
          : entry.name,
        entry.kind, entry.kind === "file" ? bytes(entry.size) : "", localTime(entry.modified_unix_ms),
      ]), "The directory is empty."));
    } catch (error) {
      if (!controller.signal.aborted) fill(body, el("p", {}, `Cannot list ${path}: ${error.message}`));
    }
  }
  function crumbs(path) {
    const parts = path === "." ? [] : path.split("/");
    return el("p", {}, el("button", { type: "button", class: "link-button", onclick: () => show(".") }, "/alloc"),
      parts.map((part, i) => [" / ", i === parts.length - 1 ? part
        : el("button", { type: "button", class: "link-button", onclick: () => show(parts.slice(0, i + 1).join("/")) }, part)]));
  }
  details.addEventListener("toggle", () => { if (details.open) show("."); });
  return () => controller.abort();
}

// ---- routing ----

let stopPage = () => {};

function route() {
  stopPage();
  say("");
  delete main.dataset.allocId;
  let page, id;
  try {
    [page, id] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  } catch (_) { /* a malformed address shows the jobs */ }
  if (page === "job" && id) stopPage = jobPage(id);
  else if (page === "alloc" && id) stopPage = allocPage(id);
  else if (page === "topology") stopPage = topologyPage();
  else stopPage = jobsPage();
  document.title = `${page && id ? `${page} ${id} · ` : page === "topology" ? "Topology · " : ""}Caravan`;
}

window.addEventListener("hashchange", () => { route(); main.focus(); });
route();
learnRole();
