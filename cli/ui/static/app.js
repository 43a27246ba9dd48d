// gavel's dashboard. Rules:
// 1. Everything it shows comes from its own server: /api/events (server-sent events: the
//    overview, the recent events, then every event and overview as they come) and, for one
//    instance, /api/instances/ID (asked again when an event about it arrives, and every
//    USAGE_REFRESH_MS with an overview: its usage graphs) and the event stream /api/logs/ID.
//    The page never polls on a timer of its own.
// 2. Text from the cluster (ids, reasons, log lines) is set as text, never as HTML.
// 3. Views by the address's fragment: "#/" the cluster, "#/instance/ID" one instance,
//    "#/node/ID" one node and what runs there, "#/service/NAME" one service and its replicas
//    (the last two drawn from the overview the stream keeps sending).
// 4. Ended instances (succeeded, failed, lost, cancelled) are hidden from the cluster's
//    table unless "show ended" is ticked: the ones still to run or running are what matter.
"use strict";

const EVENTS_SHOWN = 200;
const ENDED = new Set(["succeeded", "failed", "lost", "cancelled"]);
const LOG_LINES_KEPT = 2000;

const state = {
  overview: null,
  events: [],  // newest first
  instance: null,  // the id the instance view shows
  page: {kind: "overview", id: null},  // the view the fragment names (rule 3)
  logs: null,  // its EventSource
  refetch: null,  // a pending fetch of the instance view
  instancesKey: "",  // what the instances table shows now
  servicesKey: "",  // ... the services table, the periodic jobs', the arrays'
  periodicKey: "",
  arraysKey: "",
};

// -- building the DOM (rule 2) ------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "href" || key === "title" || key === "role" || key.startsWith("aria-"))
      node.setAttribute(key, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function $(id) { return document.getElementById(id); }

function clear(node) { node.replaceChildren(); return node; }

function fmtTime(at) {
  if (!at) return "";
  const d = new Date(at * 1000);
  return d.toLocaleTimeString([], {hour12: false});
}

function fmtNumber(x, digits) {
  const text = Number(x).toFixed(digits);
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}

function badge(text, kind) {
  return el("span", {class: `badge ${kind || ""} ${text ? "b-" + text.replace(/\s+/g, "-") : ""}`,
                     text: text || "-"});
}

function bar(label, used, total, detail, what, title) {
  const share = total > 0 ? Math.max(0, Math.min(1, used / total)) : 0;
  const fill = el("span", {class: "fill"});
  fill.style.width = `${(share * 100).toFixed(1)}%`;
  const level = share >= 0.9 ? "high" : share >= 0.7 ? "mid" : "low";
  return el("div", {class: `meter ${level}`, title: title || `${what}: ${detail}`,
                    "data-meter": what, "data-share": share.toFixed(3)},
            el("span", {class: "meter-label", text: label}),
            el("span", {class: "track"}, fill),
            el("span", {class: "meter-value", text: detail}));
}

function portsText(ports) {
  return Object.entries(ports || {}).map(([name, port]) => `${name}:${port}`).join(" ");
}

function nodeLink(id) {
  return el("a", {href: `#/node/${encodeURIComponent(id)}`, class: "node-link mono", text: id});
}

function serviceLink(name) {
  return el("a", {href: `#/service/${encodeURIComponent(name)}`, class: "service-link",
                  text: name});
}

function instanceLink(id) {
  return el("a", {href: `#/instance/${encodeURIComponent(id)}`, class: "instance-link",
                  text: id});
}

// -- the cluster view -------------------------------------------------------------------
function renderOverview() {
  const o = state.overview;
  if (!o) return;
  const banner = $("banner");
  banner.hidden = !o.error;
  banner.textContent = o.error ? `broker: ${o.error}` : "";
  renderSummary(o);
  renderNodes(o.nodes);
  renderServices(o.services, o.services_error);
  renderPeriodic(o.periodic || []);
  renderArrays(o.arrays || []);
  renderInstances(o);
  if (state.page.kind === "node") renderNodePage(state.page.id);
  if (state.page.kind === "service") renderServicePage(state.page.id);
}

function renderSummary(o) {
  const healthy = o.nodes.filter((n) => n.health === "healthy").length;
  const running = o.counts.running || 0;
  $("summary").textContent =
    `${healthy}/${o.nodes.length} nodes healthy · ${o.instances_total} instances · ` +
    `${running} running` + (o.at ? ` · ${fmtTime(o.at)}` : "");
}

function renderNodes(nodes) {
  $("nodes-count").textContent = String(nodes.length);
  const box = clear($("nodes"));
  if (!nodes.length) box.append(el("p", {class: "note", text: "No node has been heard yet."}));
  for (const n of nodes) box.append(nodeCard(n));
}

function nodeCard(n) {
  const labels = Object.entries(n.labels || {}).sort()
    .map(([k, v]) => el("span", {class: "chip", text: `${k}=${v}`}));
  const cap = n.capacity || {}, com = n.committed || {}, stats = n.stats;
  // Committed: what the broker placed there; load: what its instances measurably use
  // (their cgroups), the node's own figure, not the host's (the host's is the tooltip).
  const meters = [
    bar("cpu", com.cpu || 0, cap.cpu || 0,
        `${fmtNumber(com.cpu || 0, 2)} / ${fmtNumber(cap.cpu || 0, 2)}`, "committed cpu"),
    bar("memory", com.memory_mb || 0, cap.memory_mb || 0,
        `${com.memory_mb || 0} / ${cap.memory_mb || 0} MB`, "committed memory"),
  ];
  const used = n.cpu_used || 0, usedMb = n.memory_used_mb || 0;
  const host = stats ? ` (host: cpu ${Math.round((stats.cpu_ratio || 0) * 100)}%, ` +
    `memory ${Math.round((stats.memory_ratio || 0) * 100)}%)` : "";
  meters.push(bar("load", used, cap.cpu || 0,
                  `${fmtNumber(used, 2)} cpu`, "node cpu used", `cpu its instances use${host}`));
  meters.push(bar("used mem", usedMb, cap.memory_mb || 0,
                  `${fmtNumber(usedMb, 1)} MB`, "node memory used",
                  `memory its instances use${host}`));
  return el("article", {class: `node h-${n.health}${n.draining ? " draining" : ""}`,
                        "data-node": n.node_id},
    el("div", {class: "node-head"},
       el("span", {class: "node-name"}, nodeLink(n.node_id)),
       badge(n.health, "health"),
       n.draining ? badge("draining", "warn") : null),
    el("div", {class: "node-meta"},
       el("span", {class: "strategy", text: n.strategy || "?"}),
       el("span", {text: `${n.instances} instance${n.instances === 1 ? "" : "s"}`}),
       el("span", {class: "seen", text: `seen ${fmtNumber(n.last_seen_s, 1)} s ago`})),
    el("div", {class: "labels"}, ...labels),
    el("div", {class: "meters"}, ...meters));
}

function renderServices(services, error) {
  // What each row shows, first: the table is rebuilt only when that changed, as the
  // instances table, so a service's link is not replaced under the pointer clicking it
  // (its replicas' usage, which the row does not show, moves with every heartbeat).
  const rows = (services || []).map((s) => {
    const d = s.deployment;
    const healthy = (s.versions || []).reduce((sum, v) => sum + (v.healthy || 0), 0);
    return [s.name, `v${s.version}`, s.stopped ? "stopped" : countText(s), String(healthy),
            d ? `${d.state} ` + (d.from_version ? `v${d.from_version}\u2192` : "") +
                `v${d.to_version}` + (d.reason ? `: ${d.reason}` : "") : "-"];
  });
  const key = JSON.stringify([services === null, rows, error]);
  if (key === state.servicesKey) return;
  state.servicesKey = key;
  const section = $("services-section");
  section.hidden = services === null && !error;  // no service verbs: say nothing
  $("services-error").hidden = !error;
  $("services-error").textContent = error || "";
  $("services").hidden = !(services && services.length);
  $("services-empty").hidden = !(services && !services.length);
  const body = clear($("services").tBodies[0]);
  for (const [name, version, count, healthy, deployment] of rows) {
    body.append(el("tr", {"data-service": name},
      el("td", {}, serviceLink(name)),
      el("td", {text: version}),
      el("td", {text: count}),
      el("td", {text: healthy}),
      el("td", {text: deployment})));
  }
}

// Periodic jobs: each one's schedule, its latest fire time and how that went, its next.
function renderPeriodic(jobs) {
  const key = JSON.stringify(jobs);  // rebuilt only when it changed (renderServices)
  if (key === state.periodicKey) return;
  state.periodicKey = key;
  $("periodic-section").hidden = !jobs.length;
  const body = clear($("periodic").tBodies[0]);
  for (const p of jobs) {
    const last = (p.history || []).slice(-1)[0];
    const outcome = !last ? "-" : last.instance_id ?
      `${last.instance_id}: ${last.outcome || "pending"}` : last.skipped;
    body.append(el("tr", {"data-periodic": p.name},
      el("td", {text: p.name}),
      el("td", {class: "mono", text: `${p.schedule} (${p.time_zone})`}),
      el("td", {class: "mono", title: p.last_run || null,
                text: p.last_run_local || p.last_run || "-"}),
      el("td", {text: outcome}),
      el("td", {class: "mono", title: p.next_run || null,
                text: p.stopped ? "cancelled" : (p.next_run_local || p.next_run || "-")})));
  }
}

// Batch arrays: each one's tally as the broker counts it (done, running, failed, pending).
function renderArrays(arrays) {
  const key = JSON.stringify(arrays);  // rebuilt only when it changed (renderServices)
  if (key === state.arraysKey) return;
  state.arraysKey = key;
  $("arrays-section").hidden = !arrays.length;
  const body = clear($("arrays").tBodies[0]);
  for (const a of arrays) {
    body.append(el("tr", {"data-array": a.array_id, "data-ended": a.ended ? "yes" : "no"},
      el("td", {class: "mono", text: a.array_id}),
      el("td", {text: `${a.count} (${a.parallelism} at once)`}),
      el("td", {text: String(a.succeeded)}),
      el("td", {text: String(a.running)}),
      el("td", {text: String(a.failed)}),
      el("td", {text: String(a.pending)}),
      el("td", {class: "reason", text: a.ended ? (a.ok ? "every task succeeded" : a.outcome) :
                                                 (a.first_failure ? `first failure: ${a.first_failure}` : "-")})));
  }
}

// Replicas of a service; a system job: on how many of its nodes an instance runs healthy.
function countText(s) {
  if (!s.system) return `${s.replicas_total ?? (s.replicas || []).length} / ${s.count}`;
  const nodes = (s.nodes || []).length;
  return `system: ${nodes - (s.waiting || []).length} / ${nodes} nodes`;
}

// What an instance measurably uses (its cgroup, as its node last said), or "-".
function usageText(i) {
  if (!i.node_id || !(i.cpu_used || i.memory_used_mb)) return "-";
  return `${fmtNumber(i.cpu_used || 0, 2)} cpu · ${fmtNumber(i.memory_used_mb || 0, 0)} MB`;
}

function reasonOf(i) {
  const why = i.state === "unschedulable" ? (i.detail || i.reason) : (i.reason || i.check);
  return (why || "").replace(/\s+/g, " ");
}

function renderInstances(o) {
  // Rebuilt only when it changed: a row is not replaced under the pointer clicking it.
  const showEnded = $("show-ended").checked;
  const key = JSON.stringify([o.instances, o.instances_total, showEnded]);
  if (key === state.instancesKey) return;
  state.instancesKey = key;
  const counts = Object.entries(o.counts).map(([s, n]) => `${n} ${s}`).join(" · ");
  $("counts").textContent = counts;
  const body = clear($("instances").tBodies[0]);
  const shown = showEnded ? o.instances : o.instances.filter((i) => !ENDED.has(i.state));
  const ended = Object.entries(o.counts).filter(([s]) => ENDED.has(s))
    .reduce((sum, [, n]) => sum + n, 0);
  $("ended-count").textContent = `(${ended})`;
  $("instances-empty").hidden = shown.length > 0;
  $("instances-empty").textContent = o.instances.length ?
    "Every instance has ended: tick \u201cshow ended\u201d to list them." :
    "No instances yet: gavel submit SPEC places one.";
  const more = o.instances_total - o.instances.length;
  $("instances-more").hidden = more <= 0;
  $("instances-more").textContent = more > 0 ? `and ${more} more (gavel status lists all)` : "";
  for (const i of shown) {
    const row = el("tr", {class: `instance s-${i.state}`, "data-instance": i.instance_id,
                          "data-state": i.state, "data-node": i.node_id || null,
                          onclick: () => { location.hash = `#/instance/${encodeURIComponent(i.instance_id)}`; }},
      el("td", {}, instanceLink(i.instance_id),
         i.service ? el("span", {class: "sub", text: ` ${i.service} v${i.version}`}) :
           (i.name && !i.instance_id.startsWith(i.name) ?
             el("span", {class: "sub", text: ` ${i.name}`}) : null)),
      el("td", {}, badge(i.state, "state")),
      el("td", {}, i.health ? badge(i.health, "health") : "-"),
      el("td", {}, i.node_id ? nodeLink(i.node_id) : "-"),
      el("td", {class: "mono usage", text: usageText(i)}),
      el("td", {class: "mono", text: portsText(i.ports) || "-"}),
      el("td", {class: "reason", text: reasonOf(i) +
                (i.restarts ? ` (${i.restarts} restarts)` : "")}));
    body.append(row);
  }
}

// -- one node, one service (rule 3) --------------------------------------------------------
function instanceRow(i, columns) {
  const cells = {
    instance: () => el("td", {}, instanceLink(i.instance_id)),
    version: () => el("td", {text: i.version ? `v${i.version}` : "-"}),
    state: () => el("td", {}, badge(i.state, "state")),
    health: () => el("td", {}, i.health ? badge(i.health, "health") : "-"),
    node: () => el("td", {}, i.node_id ? nodeLink(i.node_id) : "-"),
    ports: () => el("td", {class: "mono", text: portsText(i.ports) || "-"}),
    reason: () => el("td", {class: "reason", text: reasonOf(i)}),
  };
  return el("tr", {class: `instance s-${i.state}`, "data-instance": i.instance_id,
                   "data-state": i.state}, ...columns.map((c) => cells[c]()));
}

function renderNodePage(id) {
  const o = state.overview;
  if (!o) return;
  const n = o.nodes.find((x) => x.node_id === id);
  $("node-missing").hidden = Boolean(n);
  clear($("node-card"));
  if (n) $("node-card").append(nodeCard(n));
  const mine = o.instances.filter((i) => i.node_id === id && !ENDED.has(i.state));
  $("node-instances-count").textContent = String(mine.length);
  const body = clear($("node-instances").tBodies[0]);
  for (const i of mine)
    body.append(instanceRow(i, ["instance", "state", "health", "ports", "reason"]));
}

function renderServicePage(name) {
  const o = state.overview;
  if (!o) return;
  const s = (o.services || []).find((x) => x.name === name);
  $("service-missing").hidden = Boolean(s);
  const status = clear($("service-status"));
  const versions = clear($("service-versions").tBodies[0]);
  const replicas = clear($("service-replicas").tBodies[0]);
  if (!s) return;
  const d = s.deployment;
  status.append(badge(s.stopped ? "stopped" : "running", "state"),
    el("span", {text: `v${s.version}, ${s.count} wanted`}),
    s.healthy_version ? el("span", {text: `last healthy v${s.healthy_version}`}) : null,
    d ? el("span", {class: "reason", text: `deployment ${d.state} ` +
          (d.from_version ? `v${d.from_version}\u2192` : "") + `v${d.to_version}` +
          (d.reason ? `: ${d.reason}` : "")}) : null);
  for (const v of s.versions || [])
    versions.append(el("tr", {"data-version": String(v.version)},
      el("td", {text: `v${v.version}`}), el("td", {text: String(v.replicas)}),
      el("td", {text: String(v.healthy)})));
  $("service-replicas-count").textContent = String((s.replicas || []).length);
  for (const i of s.replicas || [])
    replicas.append(instanceRow(i, ["instance", "version", "state", "health", "node",
                                    "reason"]));
}

// A service's own events (a deploy) carry the service's name where an instance id would be.
function isService(name) {
  const services = (state.overview && state.overview.services) || [];
  return services.some((s) => s.name === name);
}

function eventItem(e, withInstance) {
  return el("li", {class: `event t-${e.type}`, "data-event-instance": e.instance_id,
                   "data-event-type": e.type},
    el("time", {text: fmtTime(e.at)}),
    withInstance ? (isService(e.instance_id) ?
      el("span", {class: "mono service-name", text: e.instance_id}) :
      instanceLink(e.instance_id)) : null,
    badge(e.type, "event-type"),
    e.node_id ? el("span", {class: "mono", text: e.node_id}) : null,
    e.exit_code !== null && e.exit_code !== undefined ?
      el("span", {class: "mono", text: `exit ${e.exit_code}`}) : null,
    e.check ? el("span", {class: "sub", text: `check ${e.check}`}) : null,
    e.repeat ? el("span", {class: "repeat", title: "said again this many times",
                           text: `\u00d7${e.repeat}`}) : null,
    e.text ? el("span", {class: "reason", text: e.text}) : null);
}

function renderEvents() {
  const list = clear($("events"));
  for (const e of state.events.slice(0, EVENTS_SHOWN)) list.append(eventItem(e, true));
  if (!state.events.length) list.append(el("li", {class: "note", text: "No events yet."}));
  if (state.instance) renderInstanceEvents();
}

function renderInstanceEvents() {
  const list = clear($("instance-events"));
  for (const e of state.events.filter((x) => x.instance_id === state.instance))
    list.append(eventItem(e, false));
}

// -- one instance (its auctions and log) --------------------------------------------------
function renderAuction(a) {
  const head = a.winner ?
    el("h3", {}, "won by ", el("span", {class: "mono", text: a.winner}),
       ` at load ${fmtNumber(a.load, 3)} — `,
       el("span", {class: a.tie_broken ? "tie-note" : "rule-note", text: a.decided_by})) :
    el("h3", {class: "unschedulable", text: a.summary || a.reason || "no winner"});
  const bids = a.bids.map((b) => {
    const fill = el("span", {class: "fill"});
    fill.style.width = `${Math.max(2, b.share * 100).toFixed(1)}%`;
    return el("div", {class: `bid${b.winner ? " winner" : ""}${b.tied ? " tied" : ""}`,
                      "data-node": b.node_id, "data-load": String(b.load)},
      el("span", {class: "who mono", text: b.node_id}),
      el("span", {class: "track"}, fill),
      el("span", {class: "load mono", text: fmtNumber(b.load, 3)}),
      el("span", {class: "strategy", text: b.strategy}),
      b.affinity ? el("span", {class: "affinity", "data-affinity": String(b.affinity),
                               text: `bid ${fmtNumber(b.load - b.affinity, 3)} ` +
                                     `${b.affinity > 0 ? "+" : "\u2212"}` +
                                     `${fmtNumber(Math.abs(b.affinity), 3)} affinity`}) : null,
      b.winner ? el("span", {class: "winner-mark", "aria-label": "winner",
                             text: "\u2605 winner"}) : null,
      b.tied ? el("span", {class: "tie-mark", text: "tied"}) : null,
      b.raised ? el("span", {class: "raised-mark", text: b.raised}) : null);
  });
  const declines = a.declines.map((d) => el("li", {class: "decline", "data-node": d.node_id},
    el("span", {class: "who mono", text: d.node_id}),
    el("span", {class: "reason", text: d.text})));
  const silent = a.silent.map((n) => el("li", {class: "silent", "data-node": n},
    el("span", {class: "who mono", text: n}),
    el("span", {class: "reason", text: "silent: no answer before the deadline"})));
  // Preemption: the nodes' offers to stop lower-priority work (the broker's order, the one
  // taken marked) and the instances the award displaced.
  const victimsText = (vs) => vs.map((v) => `${v.instance_id} (priority ${v.priority})`)
    .join(", ");
  const offers = (a.offers || []).map((o) => el("li", {class: `offer${o.taken ? " taken" : ""}`,
                                                    "data-node": o.node_id},
    el("span", {class: "who mono", text: o.node_id}),
    el("span", {class: "load mono", text: `load ${fmtNumber(o.load, 3)}`}),
    el("span", {class: "reason", text: `would stop ${victimsText(o.victims)}`}),
    o.taken ? el("span", {class: "winner-mark", text: "\u2605 taken"}) : null));
  const displaced = (a.displaced || []).length ? el("p", {class: "displaced"}, "displaced ",
    ...a.displaced.flatMap((v, k) => [k ? ", " : "", instanceLink(v.instance_id),
                                      ` (priority ${v.priority})`])) : null;
  const when = a.at ? el("time", {class: "auction-at", "data-at": String(a.at),
                                  text: fmtTime(a.at)}) : null;
  const again = a.repeat > 1 ? el("span", {class: "repeat", "data-repeat": String(a.repeat),
    title: "auctions in a row that came out the same",
    text: `\u00d7${a.repeat}` + (a.first_at ? ` since ${fmtTime(a.first_at)}` : "")}) : null;
  return el("article", {class: "auction", "data-auction": a.auction_id},
    el("div", {class: "auction-id mono"}, when, ` ${a.auction_id} `, again),
    head,
    bids.length ? el("div", {class: "bids"}, ...bids) :
      el("p", {class: "note", text: "No node bid."}),
    declines.length || silent.length ?
      el("ul", {class: "declines"}, ...declines, ...silent) : null,
    offers.length ? el("ul", {class: "offers"}, ...offers) : null,
    displaced);
}

function renderInstance(data) {
  const i = data.instance;
  $("instance-error").hidden = true;
  $("instance-title").textContent = i.instance_id;
  const parts = [badge(i.state, "state")];
  if (i.health) parts.push(badge(i.health, "health"));
  if (i.node_id) parts.push(el("span", {}, "on ", el("span", {class: "mono", text: i.node_id})));
  if (i.attempt) parts.push(el("span", {text: `attempt ${i.attempt}`}));
  if (i.restarts) parts.push(el("span", {text: `${i.restarts} restarts in place`}));
  if (Object.keys(i.ports || {}).length) parts.push(el("span", {class: "mono", text: portsText(i.ports)}));
  if (i.service) parts.push(el("span", {text: `service ${i.service} v${i.version}`}));
  const why = reasonOf(i);
  if (why) parts.push(el("span", {class: "reason", text: why}));
  if (i.array) parts.push(el("span", {text: `task of array ${i.array}`}));
  // Each time it was displaced: by whom (a link), from which node, when.
  for (const p of data.preempted_by || [])
    parts.push(el("span", {class: "reason preempted", "data-preemptor": p.instance_id},
                  `${fmtTime(p.at)} preempted on ${p.node_id} by `, instanceLink(p.instance_id),
                  p.text.slice(`preempted by ${p.instance_id}`.length)));
  clear($("instance-status")).append(...parts);
  const box = clear($("auctions"));
  if (!data.auctions.length) box.append(el("p", {class: "note", text: "No auction recorded yet."}));
  for (const a of data.auctions) box.append(renderAuction(a));
  renderUsage(i, data.usage);
}

// -- usage graphs: the instance's measured cpu and memory over the last minutes ----------
const SVG = "http://www.w3.org/2000/svg";
const USAGE_REFRESH_MS = 10000;

function spark(points, index, what, unit, digits) {
  // One small graph: the line of `index` over time, scaled to its most, the latest figure
  // and the most beside it.
  const w = 240, h = 40;
  const values = points.map((p) => p[index]);
  const top = Math.max(...values) || 1;
  const t0 = points[0][0], span = Math.max(1, points[points.length - 1][0] - t0);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("class", "spark");
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", points.map((p) =>
    `${((p[0] - t0) / span * w).toFixed(1)},${(h - p[index] / top * (h - 2) - 1).toFixed(1)}`)
    .join(" "));
  svg.append(line);
  const now = values[values.length - 1], most = Math.max(...values);
  return el("div", {class: `usage-graph ${what}`, "data-points": String(points.length)},
            el("span", {class: "usage-label", text: what}), svg,
            el("span", {class: "mono", text: `${fmtNumber(now, digits)} ${unit} now, ` +
                        `${fmtNumber(most, digits)} at most`}));
}

function renderUsage(i, points) {
  const box = clear($("instance-usage"));
  if (!points || points.length < 2) {
    box.append(el("p", {class: "note", text: i.state === "running" ?
      "Measuring: its graphs come with the next refreshes." :
      "Not running: nothing to measure."}));
    return;
  }
  const minutes = Math.max(1, Math.round((points[points.length - 1][0] - points[0][0]) / 60));
  box.append(el("p", {class: "note", text: `Measured from its cgroup, the last ${minutes} ` +
                      `minute${minutes === 1 ? "" : "s"}.`}),
             spark(points, 1, "cpu", "cpu", 2),
             spark(points, 2, "memory", "MB", 1));
}

async function fetchInstance(id) {
  try {
    const resp = await fetch(`/api/instances/${encodeURIComponent(id)}`,
                             {credentials: "same-origin"});
    const data = await resp.json();
    if (state.instance !== id) return;
    if (!resp.ok) {
      $("instance-error").hidden = false;
      $("instance-error").textContent = data.error || `the dashboard answered ${resp.status}`;
      return;
    }
    renderInstance(data);
  } catch (err) {
    $("instance-error").hidden = false;
    $("instance-error").textContent = `cannot reach the dashboard: ${err}`;
  }
}

function refetchSoon(id) {
  if (state.refetch) return;
  state.refetch = setTimeout(() => { state.refetch = null; fetchInstance(id); }, 250);
}

function openLogs(id) {
  closeLogs();
  const pre = clear($("logs"));
  $("logs-note").textContent = "asking the node for its output ...";
  $("logs-count").textContent = "";
  let count = 0;
  const src = new EventSource(`/api/logs/${encodeURIComponent(id)}`);
  state.logs = src;
  src.addEventListener("lines", (msg) => {
    const data = JSON.parse(msg.data);
    $("logs-note").textContent = "";
    for (const line of data.lines) {
      pre.append(el("span", {class: `line ${data.stream}`, text: line + "\n"}));
      count += 1;
    }
    while (pre.childNodes.length > LOG_LINES_KEPT) pre.firstChild.remove();
    $("logs-count").textContent = `${count} lines`;
    pre.scrollTop = pre.scrollHeight;
  });
  for (const kind of ["unavailable", "end"]) {
    src.addEventListener(kind, (msg) => {
      $("logs-note").textContent = JSON.parse(msg.data).text;
      $("logs-note").dataset.kind = kind;
      src.close();
    });
  }
}

function closeLogs() {
  if (state.logs) state.logs.close();
  state.logs = null;
}

// -- views and the live stream (rules 1 and 3) --------------------------------------------
// An event that says again what one of the last few said (an instance still unschedulable,
// asked for again) moves that one to the top with a count, instead of being listed again.
const REPEATS_LOOKED_AT = 10;
function addEvent(e) {
  const same = state.events.slice(0, REPEATS_LOOKED_AT).findIndex((x) =>
    x.instance_id === e.instance_id && x.type === e.type && x.text === e.text &&
    x.node_id === e.node_id);
  if (same >= 0) {
    e.repeat = (state.events[same].repeat || 1) + 1;
    state.events.splice(same, 1);
  }
  state.events.unshift(e);
  if (state.events.length > EVENTS_SHOWN) state.events.length = EVENTS_SHOWN;
}

function route() {
  const m = location.hash.match(/^#\/(instance|node|service)\/(.+)$/);
  const kind = m ? m[1] : "overview";
  const named = m ? decodeURIComponent(m[2]) : null;
  state.page = {kind, id: named};
  for (const view of ["overview", "instance", "node", "service"])
    $(`${view}-page`).hidden = view !== kind;
  if (kind === "node" || kind === "service") {
    $(`${kind}-title`).textContent = `${kind} ${named}`;
    document.title = `${named} · gavel`;
    if (kind === "node") renderNodePage(named); else renderServicePage(named);
  }
  const id = kind === "instance" ? named : null;
  if (id === state.instance) return;
  state.instance = id;
  closeLogs();
  if (id === null) { if (kind === "overview") document.title = "gavel"; return; }
  document.title = `${id} · gavel`;
  $("instance-title").textContent = id;
  clear($("instance-status"));
  clear($("auctions"));
  renderInstanceEvents();
  fetchInstance(id);
  openLogs(id);
}

function connect() {
  const src = new EventSource("/api/events");
  const live = $("live");
  src.onopen = () => { live.className = "live on"; live.textContent = "live"; };
  src.onerror = () => { live.className = "live off"; live.textContent = "reconnecting"; };
  src.addEventListener("overview", (msg) => {
    state.overview = JSON.parse(msg.data);
    renderOverview();
    // An open instance page is asked again now and then: its usage graphs move on.
    if (state.instance && Date.now() - (state.usageAt || 0) > USAGE_REFRESH_MS) {
      state.usageAt = Date.now();
      refetchSoon(state.instance);
    }
  });
  src.addEventListener("history", (msg) => {
    state.events = [];
    for (const e of JSON.parse(msg.data)) addEvent(e);
    renderEvents();
  });
  src.addEventListener("event", (msg) => {
    const e = JSON.parse(msg.data);
    addEvent(e);
    renderEvents();
    if (state.instance === e.instance_id) refetchSoon(e.instance_id);
  });
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  $("show-ended").addEventListener("change", () => { if (state.overview) renderInstances(state.overview); });
});
document.addEventListener("DOMContentLoaded", () => { route(); connect(); });
