// The Muster dashboard: reads /api/overview every few seconds and draws it (tables by hand, charts
// with Chart.js). With an auth policy the endpoint wants a bearer token: asked once, kept per tab.
"use strict";

const REFRESH_MS = 5000;
const charts = {};

function token() { return sessionStorage.getItem("muster-token") || ""; }

async function fetchOverview() {
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  const resp = await fetch("/api/overview", { headers });
  if (resp.status === 401 || resp.status === 403) {
    document.getElementById("login").hidden = false;
    throw new Error((await resp.json()).error);
  }
  if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
  return resp.json();
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
}

function quantities(resources) {
  const q = (resources && resources.quantities) || {};
  return Object.keys(q).sort().map((k) => `${k}=${q[k]}`).join(", ") || "-";
}

function fillTable(id, rows, render) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  for (const item of rows) render(body.insertRow(), item);
}

function chart(id, config) {
  if (charts[id]) {
    charts[id].data = config.data;
    charts[id].update("none");
  } else {
    charts[id] = new Chart(document.getElementById(id), config);
  }
}

// A waiting job's start estimate: "reserved 14:32 (8 nodes)", "~14:32 (2 nodes)", or why none.
function startText(j) {
  if (j.estimated_start === null || j.estimated_start === undefined) {
    return j.estimate_note ? j.estimate_note.replace(/^no estimate: /, "? ") : "-";
  }
  const at = new Date(j.estimated_start * 1000);
  const soon = j.estimated_start * 1000 - Date.now() < 20 * 3600 * 1000;
  const when = soon ? at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : at.toLocaleString();
  const nodes = `${j.estimated_nodes} node${j.estimated_nodes === 1 ? "" : "s"}`;
  return j.reserved ? `reserved ${when} (${nodes})` : `~${when} (${nodes})`;
}

function draw(data) {
  fillTable("queues", data.queues, (row, v) => {
    cell(row, v.queue.name); cell(row, v.queue.weight); cell(row, quantities(v.queue.deserved));
    cell(row, quantities(v.allocated)); cell(row, quantities(v.queue.capability));
    cell(row, v.pending_jobs); cell(row, v.running_jobs);
  });
  fillTable("jobs", data.jobs.slice().reverse(), (row, j) => {
    cell(row, j.id); cell(row, j.queue); cell(row, j.owner || "-");
    cell(row, j.stage ? `${j.phase} (${j.stage})` : j.phase); cell(row, j.pending); cell(row, j.running);
    cell(row, startText(j));
    cell(row, j.reason || "-"); cell(row, j.message, "message");
  });

  // Each queue's share of the cluster's CPU over the recent cycles.
  const cycles = data.cycles;
  const labels = cycles.map((c) => new Date(c.at * 1000).toLocaleTimeString());
  const queueNames = [...new Set(cycles.flatMap((c) => Object.keys(c.cpu_share)))].sort();
  chart("shares", {
    type: "line",
    data: { labels, datasets: queueNames.map((q) => ({ label: q, data: cycles.map((c) => c.cpu_share[q] || 0), fill: false })) },
    options: { animation: false, maintainAspectRatio: false, scales: { y: { min: 0, max: 1, title: { display: true, text: "CPU share" } } } },
  });

  // Utilisation per node and resource (a heat map as grouped bars: one bar per resource).
  const resources = [...new Set(data.nodes.flatMap((n) => Object.keys(n.utilisation)))].sort();
  chart("nodes", {
    type: "bar",
    data: {
      labels: data.nodes.map((n) => n.name),
      datasets: resources.map((r) => ({ label: r, data: data.nodes.map((n) => n.utilisation[r] ?? null) })),
    },
    options: { animation: false, maintainAspectRatio: false, scales: { y: { min: 0, max: 1, title: { display: true, text: "used / allocatable" } } } },
  });

  // Nodes that take no new work: their backend silent (docs/operations.md) or reporting them so.
  fillTable("unready", data.nodes.filter((n) => !n.ready), (row, n) => {
    cell(row, n.name); cell(row, n.backend); cell(row, n.not_ready_reason || "-", "message");
  });

  // Seconds per action of each recent cycle, stacked.
  const actions = [...new Set(cycles.flatMap((c) => Object.keys(c.actions)))];
  chart("cycles", {
    type: "bar",
    data: { labels: cycles.map((c) => c.cycle_id), datasets: actions.map((a) => ({ label: a, data: cycles.map((c) => c.actions[a] || 0) })) },
    options: { animation: false, maintainAspectRatio: false, scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: "seconds" } } } },
  });
  document.getElementById("status").textContent =
    `${data.queues.length} queues, ${data.nodes.length} nodes, ${data.jobs.length} recent jobs, updated ${new Date().toLocaleTimeString()}`;
  document.body.dataset.ready = "true";  // tests wait for this
}

async function refresh() {
  try {
    draw(await fetchOverview());
  } catch (err) {
    document.getElementById("status").textContent = `error: ${err.message}`;
  }
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("muster-token", document.getElementById("token").value);
  document.getElementById("login").hidden = true;
  refresh();
});
refresh();
setInterval(refresh, REFRESH_MS);
