// raftmq web console: plain JavaScript over the management API (/api/...), no build step and no library.
// How it works: the login form checks the credentials with GET /api/whoami and keeps them in sessionStorage (as
// RabbitMQ's console keeps them); every request sends them as a Basic Authorization header, with fetch's
// credentials "omit" so the browser never shows its own login dialog; a listing the user's tags do not allow
// (401 with another reason than "Login failed", e.g. nodes for a plain management user) is left out. The page
// named by the URL hash (#overview, #queues, #connections, #exchanges, #policies, #links) is rendered from the
// API and re-rendered every REFRESH_MS; the overview keeps the last HISTORY samples of queued messages and of
// message rates (the deltas of the overview's message_stats counters) and draws them as SVG line charts.
"use strict";

const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh")) || 5000;  // ?refresh=ms
const HISTORY = 60;
const KEY = "raftmq-console-auth";
const history = { queued: [], rates: [], last: null };
let timer = null;

function $(id) { return document.getElementById(id); }

function esc(value) {
  if (value === null || value === undefined) return "";
  const text = typeof value === "object" ? JSON.stringify(value) : String(value);
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function bytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

async function api(path) {
  const auth = sessionStorage.getItem(KEY);
  const response = await fetch(path, { credentials: "omit", headers: auth ? { Authorization: auth } : {} });
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    if (body.reason !== "Login failed") return null;  // the user's tags do not allow this listing (as RabbitMQ's)
    logout("Login failed");
    throw new Error("not logged in");
  }
  if (!response.ok) throw new Error(path + " answered " + response.status);
  return response.json();
}

function table(id, columns, rows) {
  if (rows === null) return '<p id="' + id + '" class="status">(not shown: needs another user tag)</p>';
  const head = columns.map((c) => "<th>" + esc(c[0]) + "</th>").join("");
  const body = rows.length ? rows.map((r) => "<tr>" + columns.map((c) => {
    const value = c[1](r);
    return "<td" + (typeof value === "number" ? ' class="num"' : "") + ">" + (c[2] ? value : esc(value)) + "</td>";
  }).join("") + "</tr>").join("")
    : '<tr><td colspan="' + columns.length + '">(none)</td></tr>';
  return '<table id="' + id + '"><thead><tr>' + head + "</tr></thead><tbody>" + body + "</tbody></table>";
}

function chart(id, title, series, samples) {
  const w = 420, h = 140, pad = 30;
  let max = 1;
  for (const s of samples) for (const v of s.values) max = Math.max(max, v);
  const x = (i) => pad + (i * (w - pad - 6)) / Math.max(HISTORY - 1, 1);
  const y = (v) => h - 18 - (v * (h - 30)) / max;
  let lines = "";
  series.forEach((name, k) => {
    const points = samples.map((s, i) => x(i).toFixed(1) + "," + y(s.values[k]).toFixed(1)).join(" ");
    lines += '<polyline fill="none" stroke-width="2" stroke="' + COLORS[k] + '" points="' + points + '"/>';
  });
  const axis = '<line x1="' + pad + '" y1="' + (h - 18) + '" x2="' + (w - 6) + '" y2="' + (h - 18) +
    '" stroke="#999"/><text x="2" y="16" font-size="11">' + esc(fmt(max)) + '</text><text x="2" y="' + (h - 18) +
    '" font-size="11">0</text>';
  const legend = series.map((name, k) => '<span style="color:' + COLORS[k] + '">&#9632; ' + esc(name) + " " +
    esc(fmt(samples.length ? samples[samples.length - 1].values[k] : 0)) + "</span>").join("");
  return '<div class="chart" id="' + id + '"><b>' + esc(title) + "</b><br><svg width=\"" + w + '" height="' + h +
    '">' + axis + lines + '</svg><div class="legend">' + legend + "</div></div>";
}
const COLORS = ["#2980b9", "#e67e22", "#27ae60", "#8e44ad"];

function fmt(v) { return Number.isInteger(v) ? String(v) : v.toFixed(1); }

function push(list, sample) {
  list.push(sample);
  while (list.length > HISTORY) list.shift();
}

function bar(used, limit, alarm) {
  const share = limit ? Math.min(100, (100 * used) / limit) : 0;
  return '<span class="bar"><i class="' + (alarm ? "alarm" : "") + '" style="width:' + share.toFixed(0) +
    '%"></i></span> ';
}

async function overview() {
  const [ov, nodes] = await Promise.all([api("/api/overview"), api("/api/nodes")]);
  const now = Date.now();
  const qt = ov.queue_totals || {};
  push(history.queued, { values: [qt.messages_ready || 0, qt.messages_unacknowledged || 0] });
  const ms = ov.message_stats || {};
  if (history.last) {
    const dt = Math.max((now - history.last.at) / 1000, 0.001);
    const rate = (k) => Math.max(0, ((ms[k] || 0) - (history.last.stats[k] || 0)) / dt);
    push(history.rates, { values: [rate("publish"), rate("deliver_get"), rate("confirm")] });
  }
  history.last = { at: now, stats: ms };
  const ot = ov.object_totals || {};
  const totals = [["Connections", ot.connections], ["Channels", ot.channels], ["Exchanges", ot.exchanges],
    ["Queues", ot.queues], ["Consumers", ot.consumers], ["Messages", qt.messages]];
  return "<h1>Overview</h1><p>Cluster <b id=\"cluster-name\">" + esc(ov.cluster_name) + "</b>, answered by node " +
    esc(ov.node) + ", " + esc(ov.product_name) + " " + esc(ov.product_version) + '</p><div class="totals" id="totals">' +
    totals.map((t) => "<div>" + esc(t[0]) + "<b>" + esc(t[1] === undefined ? 0 : t[1]) + "</b></div>").join("") +
    '</div><div class="charts">' +
    chart("chart-queued", "Queued messages", ["Ready", "Unacked"], history.queued) +
    chart("chart-rates", "Message rates (/s)", ["Publish", "Deliver / get", "Confirm"], history.rates) +
    "</div><h2>Nodes</h2>" + table("nodes", [
      ["Name", (n) => n.name],
      ["Running", (n) => n.running ? '<span class="ok">running</span>' : '<span class="bad">down</span>', true],
      ["Memory", (n) => n.mem_used === undefined ? "?" : bar(n.mem_used, n.mem_limit, n.mem_alarm) +
        esc(bytes(n.mem_used) + " of " + bytes(n.mem_limit)) + (n.mem_alarm ? ' <span class="bad">ALARM</span>' : ""), true],
      ["Disk free", (n) => n.disk_free === undefined ? "?" : esc(bytes(n.disk_free) + " (limit " +
        bytes(n.disk_free_limit) + ")") + (n.disk_free_alarm ? ' <span class="bad">ALARM</span>' : ""), true],
      ["Uptime (s)", (n) => n.uptime === undefined ? "" : Math.round(n.uptime / 1000)],
    ], nodes);
}

function replication(q) {
  const raft = q.raft;
  if (!raft || raft.term === undefined) return (q.members || []).length > 1 ? "?" : "single";
  if (raft.match) {
    const last = raft.last_index;
    const behind = Object.entries(raft.match).filter((e) => e[0] !== String(raft.leader) && e[1] < last);
    return "leader here, term " + raft.term + ", " + (behind.length ? behind.length + " behind" : "all in sync");
  }
  return raft.role + ", term " + raft.term + ", applied " + raft.applied + "/" + raft.commit;
}

async function queues() {
  const rows = await api("/api/queues");
  return "<h1>Queues</h1>" + table("queues", [
    ["Vhost", (q) => q.vhost], ["Name", (q) => q.name], ["Type", (q) => q.type],
    ["Leader", (q) => q.leader], ["Members", (q) => (q.members || []).join(", ")],
    ["Replication", replication], ["State", (q) => q.state], ["Policy", (q) => q.policy || ""],
    ["Ready", (q) => q.messages_ready], ["Unacked", (q) => q.messages_unacknowledged],
    ["Consumers", (q) => q.consumers],
  ], rows);
}

async function connections() {
  const [conns, chans] = await Promise.all([api("/api/connections"), api("/api/channels")]);
  return "<h1>Connections</h1>" + table("connections", [
    ["Name", (c) => c.name], ["Node", (c) => c.node], ["User", (c) => c.user], ["Vhost", (c) => c.vhost],
    ["Channels", (c) => c.channels], ["State", (c) => c.state], ["Protocol", (c) => c.protocol],
  ], conns) + "<h2>Channels</h2>" + table("channels", [
    ["Name", (c) => c.name], ["Node", (c) => c.node], ["User", (c) => c.user], ["Vhost", (c) => c.vhost],
    ["Consumers", (c) => c.consumer_count], ["Unacked", (c) => c.messages_unacknowledged],
    ["Prefetch", (c) => c.prefetch_count], ["Confirm", (c) => c.confirm ? "yes" : "no"],
  ], chans);
}

async function exchanges() {
  const [exs, binds] = await Promise.all([api("/api/exchanges"), api("/api/bindings")]);
  return "<h1>Exchanges</h1>" + table("exchanges", [
    ["Vhost", (e) => e.vhost], ["Name", (e) => e.name || "(AMQP default)"], ["Type", (e) => e.type],
    ["Durable", (e) => e.durable ? "yes" : "no"], ["Internal", (e) => e.internal ? "yes" : "no"],
    ["Policy", (e) => e.policy || ""],
  ], exs) + "<h2>Bindings</h2>" + table("bindings", [
    ["Vhost", (b) => b.vhost], ["Source", (b) => b.source || "(AMQP default)"],
    ["Destination", (b) => b.destination], ["Type", (b) => b.destination_type],
    ["Routing key", (b) => b.routing_key], ["Arguments", (b) => b.arguments],
  ], binds);
}

async function policies() {
  const rows = await api("/api/policies");
  return "<h1>Policies</h1>" + table("policies", [
    ["Vhost", (p) => p.vhost], ["Name", (p) => p.name], ["Pattern", (p) => p.pattern],
    ["Apply to", (p) => p["apply-to"]], ["Definition", (p) => p.definition], ["Priority", (p) => p.priority],
  ], rows);
}

async function links() {
  const [shovels, feds] = await Promise.all([api("/api/shovels"), api("/api/federation-links")]);
  return "<h1>Shovels</h1>" + table("shovels", [
    ["Vhost", (s) => s.vhost], ["Name", (s) => s.name], ["Type", (s) => s.type], ["State", (s) => s.state],
    ["Node", (s) => s.node], ["Source", (s) => s.src_uri || s.src_queue || s.src_exchange || ""],
    ["Destination", (s) => s.dest_uri || s.dest_queue || s.dest_exchange || ""],
  ], shovels) + "<h1>Federation links</h1>" + table("federation-links", [
    ["Vhost", (f) => f.vhost], ["Upstream", (f) => f.upstream], ["Type", (f) => f.type],
    ["Object", (f) => f.exchange || f.queue || ""], ["Status", (f) => f.status], ["Node", (f) => f.node],
  ], feds);
}

const PAGES = { overview, queues, connections, exchanges, policies, links };

function currentPage() {
  const name = location.hash.replace(/^#/, "");
  return PAGES[name] ? name : "overview";
}

async function render() {
  if (timer) clearTimeout(timer);
  timer = null;
  if (!sessionStorage.getItem(KEY)) return;
  const name = currentPage();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  try {
    const html = await PAGES[name]();
    if (currentPage() !== name) return;
    const page = $("page");
    page.innerHTML = html;
    page.dataset.page = name;
    page.dataset.loaded = String(Date.now());
    $("status").textContent = "Refreshed " + new Date().toLocaleTimeString() + "; every " + REFRESH_MS / 1000 + " s";
  } catch (err) {
    $("status").textContent = "Error: " + err.message;
  }
  if (sessionStorage.getItem(KEY)) timer = setTimeout(render, REFRESH_MS);
}

function showLoggedIn(user) {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("page").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = "User " + user;
}

function logout(message) {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(KEY + "-user");
  if (timer) clearTimeout(timer);
  $("login").hidden = false;
  $("nav").hidden = true;
  $("page").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

async function login(event) {
  event.preventDefault();
  const user = $("username").value;
  const auth = "Basic " + btoa(unescape(encodeURIComponent(user + ":" + $("password").value)));
  const response = await fetch("/api/whoami", { credentials: "omit", headers: { Authorization: auth } });
  if (!response.ok) {
    $("login-error").textContent = response.status === 401 ? "Login failed" : "Error " + response.status;
    return;
  }
  sessionStorage.setItem(KEY, auth);
  sessionStorage.setItem(KEY + "-user", user);
  showLoggedIn(user);
  render();
}

$("login").addEventListener("submit", login);
$("logout").addEventListener("click", () => logout(""));
window.addEventListener("hashchange", render);
if (sessionStorage.getItem(KEY)) {
  showLoggedIn(sessionStorage.getItem(KEY + "-user") || "");
  render();
} else {
  logout("");
}
