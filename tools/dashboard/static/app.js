// The console's page logic: one EventSource on /api/events feeds every live
// view (cluster, topics, consumers); searches, the daily pages (producers,
// messages by time, DLQ, broker config, routes, groups) and admin writes are
// fetches.  With accounts configured, writes and message bodies need a login
// (the session cookie is HttpOnly: this script never sees it).
// Text from the cluster (topic names, message bodies) only ever goes into
// textContent, never into HTML.
"use strict";

const WRITE_HEADERS = {"Content-Type": "application/json", "X-Ledgermq-Console": "write"};
let snap = null;
let charts = {};

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "–" : String(c)));
  return e;
}
function table(headers, rows, attrs) {
  return el("table", attrs, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))),
            el("tbody", {}, ...rows));
}
const fmtRate = r => r === null || r === undefined ? "–" : r.toFixed(1);
const fmtTime = ms => ms > 0 ? new Date(ms).toLocaleTimeString() : "–";
function showError(id, text) { const e = document.getElementById(id); e.textContent = text || ""; e.hidden = !text; }

// --- tabs ---------------------------------------------------------------------------------
function showTab() {
  const tab = (location.hash || "#cluster").slice(1);
  for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== "tab-" + tab;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.tab === tab);
  if (tab === "producers") loadProducerGroups();
  if (snap) render();
}
window.addEventListener("hashchange", showTab);

// --- live data -----------------------------------------------------------------------------
function connect() {
  const es = new EventSource("/api/events");
  es.onmessage = ev => {
    snap = JSON.parse(ev.data);
    document.getElementById("status").textContent = "live · sample " + snap.version + " · " + fmtTime(snap.t);
    render();
  };
  es.onerror = () => { document.getElementById("status").textContent = "reconnecting…"; };
}

function render() {
  renderCluster();
  renderTopics();
  renderConsumers();
  renderReplicationGroups();
  renderBrokerChoices();
}
async function getJson(url) {
  const r = await fetch(url);
  const body = await r.json();
  if (r.status === 401) refreshSession();
  return body;
}

function nodeRole(n) {
  if (n.error) return "DOWN";
  return n.raftRole === "LEADER" ? "MASTER" : "SLAVE";
}

function renderCluster() {
  showError("cluster-error", snap.error);
  const box = document.getElementById("groups");
  box.replaceChildren(...snap.groups.map(g => {
    const rows = g.nodes.map(n => el("tr", {"data-node": n.selfId || n.addr, "data-role": nodeRole(n)},
      el("td", {}, n.selfId), el("td", {}, n.addr), el("td", {}, el("span", {class: "role " + nodeRole(n)}, nodeRole(n))),
      el("td", {}, n.error ? "unreachable" : n.raftRole), el("td", {class: "term"}, n.term), el("td", {}, n.committedIndex),
      el("td", {}, n.diskRatio === null ? null : (n.diskRatio * 100).toFixed(1) + "%"),
      el("td", {}, fmtRate(n.putRate)), el("td", {}, fmtRate(n.getRate)), metricsCell(n.metrics)));
    // Gone from the name server: the address it last registered with (or its DLedger address).
    for (const m of g.missing) rows.push(el("tr", {"data-node": m.selfId, "data-role": "DOWN"}, el("td", {}, m.selfId),
      el("td", {class: "addr", title: "no longer registered with the name server"},
         m.addr || (m.raftAddr ? m.raftAddr + " (DLedger)" : "unknown")),
      el("td", {}, el("span", {class: "role DOWN"}, "DOWN")), el("td", {}), el("td", {}), el("td", {}), el("td", {}), el("td", {}), el("td", {}), el("td", {})));
    const peers = g.peers.map(p => el("tr", {"data-peer": p.peer}, el("td", {}, p.peer), el("td", {}, p.matchIndex),
      el("td", {}, p.lag), el("td", {}, p.lastAckMsAgo === null ? null : p.lastAckMsAgo + " ms"), el("td", {}, p.state)));
    return el("div", {class: "group", "data-group": g.brokerName},
      el("h2", {}, g.brokerName + " (" + g.cluster + ") · master ",
         el("span", {class: "master"}, g.master || "none"), " · term ", el("span", {class: "group-term"}, g.term)),
      table(["Node", "Address", "Role", "Raft", "Term", "Committed", "Disk", "Put/s", "Pull/s", "Prometheus"], rows, {class: "nodes"}),
      peers.length ? table(["Peer", "Match index", "Lag (entries)", "Last ack", "State"], peers, {class: "peers"}) : "");
  }));
  const list = document.getElementById("term-changes");
  list.replaceChildren(...snap.termChanges.slice().reverse().map(c => el("li", {class: "term-change"},
    fmtTime(c.t) + ": " + c.group + " term " + c.fromTerm + " → " + c.toTerm + ", leader " + (c.fromLeader || "none") + " → " + (c.toLeader || "none"))));
  if (!document.getElementById("tab-cluster").hidden) drawClusterCharts();
}

// From the broker's /metrics when it exports one (metricsExporterType=PROM).
function metricsCell(m) {
  if (!m) return el("td", {class: "metrics"}, "off");
  if (m.error) return el("td", {class: "metrics", title: m.error}, "unreachable");
  const parts = ["RSS " + (m.rssBytes / 1048576).toFixed(0) + " MiB", "send p99 " + (m.sendP99Ms === null ? "–" : m.sendP99Ms + " ms")];
  if (m.appendErrors) parts.push(m.appendErrors + " append errors");
  return el("td", {class: "metrics", "data-rss": m.rssBytes}, parts.join(" · "));
}

function drawChart(id, series, data) {
  const box = document.getElementById(id);
  const key = id + ":" + series.map(s => s.label).join(",");
  if (!charts[id] || charts[id].key !== key) {
    if (charts[id]) charts[id].plot.destroy();
    const colors = ["#2f7ed8", "#e4572e", "#17a589", "#a569bd", "#f1c40f", "#5d6d7e"];
    // Axis labels never overlap: time ticks at least 90 px apart, the value axis as wide as its widest label.
    const opts = {width: 560, height: 220, series: [{}, ...series.map((s, i) => ({stroke: colors[i % colors.length], width: 2, ...s}))],
                  axes: [{space: 90}, {size: fitAxis, space: 30}]};
    charts[id] = {key, plot: new uPlot(opts, data, box)};
  } else {
    charts[id].plot.setData(data);
  }
}

function fitAxis(self, values, axisIdx, cycleNum) {
  const axis = self.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  let size = axis.ticks.size + axis.gap;
  const longest = (values || []).reduce((acc, v) => String(v).length > acc.length ? String(v) : acc, "");
  if (longest) { self.ctx.font = axis.font[0]; size += self.ctx.measureText(longest).width / devicePixelRatio; }
  return Math.ceil(size) + 4;
}

function drawClusterCharts() {
  const pts = snap.history;
  const names = [...new Set(pts.flatMap(p => Object.keys(p.groups)))].sort();
  const xs = pts.map(p => p.t / 1000);
  const rs = [], rd = [xs], ts = [], td = [xs];
  for (const n of names) {
    rs.push({label: n + " send"}, {label: n + " pull", dash: [6, 4]});
    rd.push(pts.map(p => p.groups[n] ? p.groups[n].put : null), pts.map(p => p.groups[n] ? p.groups[n].get : null));
    ts.push({label: n + " term", paths: uPlot.paths.stepped({align: 1})});
    td.push(pts.map(p => p.groups[n] ? p.groups[n].term : null));
  }
  drawChart("chart-rates", rs, rd);
  drawChart("chart-terms", ts, td);
}

// --- topics ------------------------------------------------------------------------------------
function renderTopics() {
  const showSystem = document.getElementById("show-system").checked;
  const rows = snap.topics.filter(t => showSystem || !t.system).map(t => el("tr", {"data-topic": t.topic},
    el("td", {}, t.topic), el("td", {}, t.queues.length),
    el("td", {}, t.queues.reduce((a, q) => a + q.maxOffset - q.minOffset, 0)), el("td", {}, fmtRate(t.putRate)),
    el("td", {class: "queues"}, t.queues.map(q => q.brokerName + "/" + q.queueId + ": " + q.minOffset + "–" + q.maxOffset).join("  ")),
    el("td", {}, el("button", {type: "button", "data-route": t.topic}, "Route"), " ",
       el("button", {type: "button", class: "danger", "data-delete-topic": t.topic}, "Delete…"))));
  document.querySelector("#topics-table tbody").replaceChildren(...rows);
  for (const b of document.querySelectorAll("[data-route]")) b.onclick = () => showRoute(b.dataset.route);
  for (const b of document.querySelectorAll("[data-delete-topic]")) b.onclick = () => deleteTopic(b.dataset.deleteTopic);
}
const clusterName = () => snap && snap.groups.length ? snap.groups[0].cluster : "";
async function showRoute(topic) {
  const r = await getJson("/api/routes?topic=" + encodeURIComponent(topic));
  showError("route-error", r.error);
  const box = document.getElementById("route-result");
  if (r.error) { box.replaceChildren(); return; }
  box.replaceChildren(el("div", {class: "group route", "data-topic": topic}, el("h2", {}, "Route of " + topic),
    table(["Cluster", "Broker", "Broker id", "Address"], r.brokers.flatMap(b => b.addrs.map(a => el("tr", {},
      el("td", {}, b.cluster), el("td", {}, b.brokerName), el("td", {}, a.brokerId), el("td", {class: "addr"}, a.addr)))), {class: "route-brokers"}),
    table(["Broker", "Read queues", "Write queues", "Perm"], r.queues.map(q => el("tr", {"data-broker": q.brokerName},
      el("td", {}, q.brokerName), el("td", {class: "read"}, q.readQueueNums), el("td", {class: "write"}, q.writeQueueNums), el("td", {}, q.perm))),
      {class: "route-queues"})));
}
function deleteTopic(topic) {
  confirmWrite("Delete topic " + topic, [{name: "topic", label: "Topic", value: topic}, {name: "cluster", label: "Cluster", value: clusterName()}],
    v => "deleteTopic -c " + v.cluster + " -t " + v.topic + "\nfrom every master of " + v.cluster + " and the name servers; its messages and offsets are gone",
    v => post("/api/topics/delete", v));
}
document.getElementById("show-system").addEventListener("change", () => snap && renderTopics());

// A confirm step for every admin write: fields, then a summary of exactly what will be sent.
function confirmWrite(title, fields, summarize, send) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  const box = document.getElementById("confirm-fields");
  box.replaceChildren(...fields.map(f => el("label", {}, f.label + " ",
    el("input", {name: f.name, id: "f-" + f.name, value: f.value ?? "", type: f.type || "text"}))));
  showError("confirm-error", "");
  const values = () => Object.fromEntries(fields.map(f => [f.name, document.getElementById("f-" + f.name).value]));
  const update = () => { document.getElementById("confirm-summary").textContent = summarize(values()); };
  box.oninput = update; update();
  document.getElementById("confirm-ok").onclick = async ev => {
    ev.preventDefault();
    const res = await send({...values(), confirmed: true});
    if (res.error) { showError("confirm-error", res.error); return; }
    dlg.close();
  };
  dlg.showModal();
}
async function post(url, body) {
  const r = await fetch(url, {method: "POST", headers: WRITE_HEADERS, body: JSON.stringify(body)});
  const answer = await r.json();
  if (r.status === 401) refreshSession();
  return answer;
}
document.getElementById("topic-new").addEventListener("click", () => {
  const cluster = clusterName();
  confirmWrite("Create or update a topic", [
    {name: "topic", label: "Topic"}, {name: "cluster", label: "Cluster", value: cluster},
    {name: "readQueueNums", label: "Read queues", value: 8, type: "number"},
    {name: "writeQueueNums", label: "Write queues", value: 8, type: "number"},
    {name: "perm", label: "Perm (2 W, 4 R, 6 RW)", value: 6, type: "number"}],
    v => "updateTopic -c " + v.cluster + " -t " + v.topic + " -r " + v.readQueueNums + " -w " + v.writeQueueNums + " -p " + v.perm +
         "\non every master of " + v.cluster,
    v => post("/api/topics", {...v, readQueueNums: +v.readQueueNums, writeQueueNums: +v.writeQueueNums, perm: +v.perm}));
});

// --- consumer groups -------------------------------------------------------------------------
let selectedGroup = null;
function renderConsumers() {
  const rows = snap.consumers.map(c => el("tr", {"data-group": c.group},
    el("td", {}, c.group),
    el("td", {class: "members"}, (c.clients || []).length ? c.clients.map(m => m.clientId + " (" + m.language + ", " + m.versionDesc + ")").join(", ") : "none online"),
    el("td", {class: "lag"}, c.lag), el("td", {}, el("button", {type: "button", "data-reset": c.group}, "Reset offset…"), " ",
      el("button", {type: "button", "data-edit-group": c.group}, "Config…"), " ",
      el("button", {type: "button", class: "danger", "data-delete-group": c.group}, "Delete…"))));
  document.querySelector("#consumers-table tbody").replaceChildren(...rows);
  for (const b of document.querySelectorAll("[data-reset]")) b.onclick = () => resetOffset(b.dataset.reset);
  for (const b of document.querySelectorAll("[data-edit-group]")) b.onclick = () => editGroup(b.dataset.editGroup);
  for (const b of document.querySelectorAll("[data-delete-group]")) b.onclick = () => deleteGroup(b.dataset.deleteGroup);
  for (const r of document.querySelectorAll("#consumers-table tbody tr")) r.onclick = ev => {
    if (ev.target.tagName !== "BUTTON") { selectedGroup = r.dataset.group; renderConsumers(); } };
  const g = snap.consumers.find(c => c.group === selectedGroup);
  document.getElementById("consumer-detail").replaceChildren(g ? table(["Topic", "Group/Queue", "Broker offset", "Consumer offset", "Lag", "Last consumed"],
    g.queues.map(q => el("tr", {}, el("td", {}, q.topic), el("td", {}, q.brokerName + "/" + q.queueId), el("td", {}, q.brokerOffset),
      el("td", {}, q.consumerOffset), el("td", {}, q.lag), el("td", {}, fmtTime(q.lastTimestamp))))) : "");
  if (!document.getElementById("tab-consumers").hidden) {
    // Every group's total; once a group is picked, each of its queues.
    const pts = snap.lagHistory;
    const per = p => g ? (p.queues[g.group] || {}) : p.lag;
    const names = [...new Set(pts.flatMap(p => Object.keys(per(p))))].sort();
    document.getElementById("lag-caption").textContent = g ? "Lag per queue of " + g.group + ", last minutes" : "Lag per group, last minutes";
    drawChart("chart-lag", names.map(n => ({label: n})), [pts.map(p => p.t / 1000), ...names.map(n => pts.map(p => per(p)[n] ?? null))]);
  }
}
function resetOffset(group) {
  const c = snap.consumers.find(x => x.group === group);
  const subscribed = c ? c.queues.map(q => q.topic).filter(t => !t.startsWith("%RETRY%")) : [];
  const topic = subscribed.length ? subscribed[0] : "";
  confirmWrite("Reset the offsets of " + group, [
    {name: "group", label: "Group", value: group}, {name: "topic", label: "Topic", value: topic},
    {name: "time", label: "To the time (local)", type: "datetime-local"}],
    v => "resetOffsetByTime -g " + v.group + " -t " + v.topic + " -s " + (v.time ? new Date(v.time).getTime() : "(pick a time)") +
         "\nconsumers of the group will re-read from there",
    v => post("/api/consumers/reset", {group: v.group, topic: v.topic, timestamp: v.time ? new Date(v.time).getTime() : null, confirmed: true}));
}

// --- subscription groups: create, edit, delete ---------------------------------------------------
const GROUP_FIELDS = [["consumeEnable", "Consume enabled"], ["consumeBroadcastEnable", "Broadcast"], ["consumeFromMinEnable", "From min offset"],
  ["consumeMessageOrderly", "Orderly"], ["notifyConsumerIdsChangedEnable", "Notify id changes"], ["retryQueueNums", "Retry queues"],
  ["retryMaxTimes", "Retry max times"], ["brokerId", "Consume from broker id"], ["whichBrokerWhenConsumeSlowly", "Broker id when slow"]];
function groupDialog(title, group, config) {
  confirmWrite(title, [{name: "group", label: "Group", value: group}, {name: "cluster", label: "Cluster", value: clusterName()},
    ...GROUP_FIELDS.map(([k, label]) => ({name: k, label, value: String(config[k])}))],
    v => "updateSubGroup -c " + v.cluster + " -g " + v.group + "\n" + GROUP_FIELDS.map(([k]) => k + "=" + v[k]).join(" ") + "\non every master of " + v.cluster,
    v => post("/api/groups", v));
}
async function editGroup(group) {
  const r = await getJson("/api/groups/config?group=" + encodeURIComponent(group));
  if (r.error) { alert(r.error); return; }
  groupDialog("Edit the config of " + group, group, r.config);
}
document.getElementById("group-new").addEventListener("click", () => groupDialog("Create a subscription group", "",
  {consumeEnable: true, consumeBroadcastEnable: false, consumeFromMinEnable: false, consumeMessageOrderly: false,
   notifyConsumerIdsChangedEnable: true, retryQueueNums: 1, retryMaxTimes: 16, brokerId: 0, whichBrokerWhenConsumeSlowly: 1}));
function deleteGroup(group) {
  confirmWrite("Delete group " + group, [{name: "group", label: "Group", value: group}, {name: "cluster", label: "Cluster", value: clusterName()},
    {name: "removeOffset", label: "Also its offsets, %RETRY% and %DLQ% (true/false)", value: "false"}],
    v => "deleteSubGroup -c " + v.cluster + " -g " + v.group + " -r " + v.removeOffset,
    v => post("/api/groups/delete", {...v, removeOffset: v.removeOffset === "true"}));
}

// --- producers ------------------------------------------------------------------------------------
async function loadProducerGroups() {
  const r = await getJson("/api/producers/groups");
  const errors = r.error ? [r.error] : Object.entries(r.errors).map(([a, e]) => a + ": " + e);
  showError("prod-groups-error", errors.join("; "));
  const note = document.getElementById("prod-groups-note");
  note.textContent = r.error ? "" : Object.entries(r.notes).map(([a, n]) => a + ": " + n).join("; ");
  note.hidden = !note.textContent;
  const rows = r.error ? [] : r.groups.flatMap(g => g.connections.map(c => el("tr", {"data-group": g.group, "data-client": c.clientId},
    el("td", {class: "group-name"}, g.group), el("td", {}, c.clientId), el("td", {}, c.clientAddr),
    el("td", {class: "language"}, c.language), el("td", {class: "version"}, c.versionDesc), el("td", {}, c.brokers.join(", ")))));
  if (!r.error && !rows.length) rows.push(el("tr", {}, el("td", {colspan: 6}, "no producer is connected to any master")));
  document.querySelector("#prod-groups tbody").replaceChildren(...rows);
}
document.getElementById("prod-refresh").addEventListener("click", loadProducerGroups);
document.getElementById("prod-form").addEventListener("submit", async ev => {
  ev.preventDefault();
  const r = await getJson("/api/producers?group=" + encodeURIComponent(document.getElementById("prod-group").value));
  showError("prod-error", r.error);
  const t = document.getElementById("prod-table");
  t.hidden = !!r.error;
  if (r.error) return;
  t.querySelector("tbody").replaceChildren(...r.connections.map(c => el("tr", {"data-client": c.clientId},
    el("td", {}, c.clientId), el("td", {}, c.clientAddr), el("td", {class: "language"}, c.language),
    el("td", {class: "version"}, c.versionDesc), el("td", {}, c.brokers.join(", ")))));
});

// --- selectable message lists (time range, DLQ) with resend ----------------------------------------
function messageRows(tbody, messages, extra) {
  tbody.replaceChildren(...messages.map((m, i) => el("tr", {"data-msgid": m.msgId, "data-i": i},
    el("td", {}, el("input", {type: "checkbox", class: "pick"})), el("td", {}, m.msgId), ...extra(m),
    el("td", {class: "body", title: m.body ?? m.bodyHex}, m.body !== null ? m.body : "hex " + m.bodyHex))));
}
function picked(tbody, messages) {
  return [...tbody.querySelectorAll("tr")].filter(r => r.querySelector(".pick").checked).map(r => messages[+r.dataset.i])
    .map(m => ({topic: m.topic, brokerName: m.brokerName, queueId: m.queueId, queueOffset: m.queueOffset}));
}
function wirePicks(all, tbody, button) {
  const sync = () => { button.disabled = !tbody.querySelector(".pick:checked"); };
  tbody.onchange = sync; sync();
  all.checked = false;
  all.onchange = () => { for (const c of tbody.querySelectorAll(".pick")) c.checked = all.checked; sync(); };
}
function resendDialog(title, items, toOriginal, where) {
  confirmWrite(title, [], () => items.length + " message(s) sent again " + where + "\n" +
      items.map(m => m.topic + " " + m.brokerName + "/" + m.queueId + " @ " + m.queueOffset).join("\n"),
    () => post("/api/messages/resend", {messages: items, toOriginal, confirmed: true}).then(r => {
      if (!r.error) document.getElementById("status").dataset.resent = r.resent.length; return r; }));
}

let rangeMessages = [];
const localMs = v => v ? new Date(v).getTime() : "";
document.getElementById("range-form").addEventListener("submit", async ev => {
  ev.preventDefault();
  const v = id => document.getElementById(id).value;
  const p = new URLSearchParams({topic: v("range-topic"), begin: localMs(v("range-begin")), end: localMs(v("range-end")), limit: 200});
  const r = await getJson("/api/messages/range?" + p);
  showError("range-error", r.error || (r.truncated ? "only the first " + r.messages.length + " messages are shown" : ""));
  const t = document.getElementById("range-table");
  t.hidden = !!r.error;
  if (r.error) return;
  rangeMessages = r.messages;
  messageRows(t.querySelector("tbody"), rangeMessages, m => [el("td", {}, m.brokerName + "/" + m.queueId + " @ " + m.queueOffset),
    el("td", {}, fmtTime(m.storeTimestamp)), el("td", {}, m.tags), el("td", {}, m.keys.join(" "))]);
  wirePicks(document.getElementById("range-all"), t.querySelector("tbody"), document.getElementById("range-resend"));
});
document.getElementById("range-resend").addEventListener("click", () => {
  const items = picked(document.querySelector("#range-table tbody"), rangeMessages);
  resendDialog("Resend messages", items, false, "to their topic");
});

let dlqMessages = [];
document.getElementById("dlq-form").addEventListener("submit", async ev => {
  ev.preventDefault();
  const group = document.getElementById("dlq-group").value;
  const r = await getJson("/api/dlq?limit=200&group=" + encodeURIComponent(group));
  showError("dlq-error", r.error || (r.truncated ? "only the first " + r.messages.length + " messages are shown" : ""));
  const t = document.getElementById("dlq-table"), exp = document.getElementById("dlq-export");
  t.hidden = exp.hidden = !!r.error;
  if (r.error) return;
  exp.href = "/api/dlq/export?group=" + encodeURIComponent(group);
  dlqMessages = r.messages;
  messageRows(t.querySelector("tbody"), dlqMessages, m => [el("td", {class: "original"}, m.originalTopic),
    el("td", {}, m.brokerName + "/" + m.queueId + " @ " + m.queueOffset), el("td", {}, fmtTime(m.storeTimestamp)), el("td", {}, m.reconsumeTimes)]);
  wirePicks(document.getElementById("dlq-all"), t.querySelector("tbody"), document.getElementById("dlq-resend"));
});
document.getElementById("dlq-resend").addEventListener("click", () => {
  const items = picked(document.querySelector("#dlq-table tbody"), dlqMessages);
  resendDialog("Resend dead letters", items, true, "to their original topic");
});

// --- broker config ----------------------------------------------------------------------------------
function renderBrokerChoices() {
  const sel = document.getElementById("cfg-broker");
  const addrs = snap.groups.flatMap(g => g.nodes.map(n => [n.addr, g.brokerName + " " + (n.selfId || "") + " " + n.addr]));
  if ([...sel.options].map(o => o.value).join() !== addrs.map(a => a[0]).join())
    sel.replaceChildren(...addrs.map(([a, label]) => el("option", {value: a}, label)));
}
let brokerConfig = null;
function renderConfig() {
  const f = document.getElementById("cfg-filter").value.toLowerCase();
  document.querySelector("#cfg-table tbody").replaceChildren(...Object.entries(brokerConfig || {}).filter(([k]) => k.toLowerCase().includes(f))
    .map(([k, v]) => el("tr", {"data-key": k}, el("td", {}, k), el("td", {class: "value"}, v))));
}
document.getElementById("cfg-show").addEventListener("click", async () => {
  const r = await getJson("/api/brokers/config?addr=" + encodeURIComponent(document.getElementById("cfg-broker").value));
  showError("cfg-error", r.error);
  document.getElementById("cfg-table").hidden = !!r.error;
  brokerConfig = r.error ? null : r.config;
  renderConfig();
});
document.getElementById("cfg-filter").addEventListener("input", renderConfig);

// --- messages -----------------------------------------------------------------------------------
const msgBy = document.getElementById("msg-by");
msgBy.addEventListener("change", () => {
  const q = msgBy.value === "queueOffset", id = msgBy.value === "msgId";
  document.getElementById("msg-topic").hidden = id;
  document.getElementById("msg-key").hidden = q;
  for (const f of ["msg-broker", "msg-queue", "msg-offset"]) document.getElementById(f).hidden = !q;
});
document.getElementById("msg-form").addEventListener("submit", async ev => {
  ev.preventDefault();
  const p = new URLSearchParams({by: msgBy.value});
  const v = id => document.getElementById(id).value;
  if (msgBy.value === "msgId") p.set("msgId", v("msg-key"));
  else if (msgBy.value === "queueOffset") { p.set("topic", v("msg-topic")); p.set("brokerName", v("msg-broker")); p.set("queueId", v("msg-queue")); p.set("offset", v("msg-offset")); }
  else { p.set("topic", v("msg-topic")); p.set("key", v("msg-key")); }
  const r = await getJson("/api/messages?" + p);
  showError("msg-error", r.error);
  const box = document.getElementById("msg-results");
  if (r.error) { box.replaceChildren(); return; }
  box.replaceChildren(...r.messages.map(m => el("div", {class: "message group", "data-msgid": m.msgId},
    el("h2", {}, m.topic + " · " + m.msgId),
    table(["Property", "Value"], [["offsetMsgId", m.offsetMsgId], ["queue", m.queueId + " @ " + m.queueOffset], ["tags", m.tags],
      ["keys", m.keys.join(" ")], ["stored", new Date(m.storeTimestamp).toISOString()], ["reconsumeTimes", m.reconsumeTimes],
      ...Object.entries(m.properties)].map(([k, x]) => el("tr", {}, el("td", {}, k), el("td", {}, x))), {class: "props"}),
    el("h3", {}, m.body !== null ? "Body (text, " + m.bodyLength + " bytes)" : "Body (hex, " + m.bodyLength + " bytes)"),
    el("pre", {class: "body"}, m.body !== null ? m.body : m.bodyHex))),
    el("h3", {}, "Trace"),
    table(["Kind", "Topic", "Group", "Queue @ offset", "Stored", "Reconsume times"], r.trace.map(t => el("tr", {"data-kind": t.kind},
      el("td", {}, t.kind), el("td", {}, t.topic), el("td", {}, t.group), el("td", {}, t.queueId + " @ " + t.queueOffset),
      el("td", {}, fmtTime(t.storeTimestamp)), el("td", {}, t.reconsumeTimes))), {class: "trace"}));
});

// --- replication ---------------------------------------------------------------------------------
function renderReplicationGroups() {
  const sel = document.getElementById("repl-group");
  const names = snap.groups.map(g => g.brokerName);
  if ([...sel.options].map(o => o.value).join() !== names.join()) sel.replaceChildren(...names.map(n => el("option", {value: n}, n)));
}
document.getElementById("repl-run").addEventListener("click", async () => {
  const r = await (await fetch("/api/replication?group=" + encodeURIComponent(document.getElementById("repl-group").value))).json();
  showError("repl-error", r.error);
  if (r.error) return;
  document.getElementById("repl-result").replaceChildren(
    el("p", {class: r.agree ? "agree" : "error"}, r.agree ? "Replicas agree at index " + r.comparedIndex : "Replicas DISAGREE at index " + r.comparedIndex),
    table(["Node", "Address", "Role", "Committed", "Chain CRC"], r.replicas.map(x => el("tr", {}, el("td", {}, x.selfId), el("td", {}, x.addr),
      el("td", {}, x.error ? "unreachable" : x.role), el("td", {}, x.committedIndex), el("td", {}, x.chainCrc === null ? null : (x.chainCrc >>> 0).toString(16))))));
});

// --- ACL credentials: sent once, kept by the console; only the access key comes back ---------------
document.getElementById("acl-open").addEventListener("click", () => {
  confirmWrite("ACL credentials for the console's requests", [
    {name: "accessKey", label: "Access key"}, {name: "secretKey", label: "Secret key", type: "password"}],
    v => "sign every admin request as " + (v.accessKey || "(nobody: unsigned)"),
    async v => { const r = await post("/api/credentials", v); if (!r.error) showAcl(r); return r; });
});
function showAcl(r) { document.getElementById("acl-open").textContent = r.signing ? "ACL: " + r.accessKey : "ACL credentials"; }
fetch("/api/credentials").then(r => r.json()).then(showAcl);

// --- login: the cookie is set by the server (HttpOnly); the page only shows who is logged in ------------
function showSession(s) {
  document.getElementById("whoami").textContent = s.user ? "logged in as " + s.user : (s.loginRequired ? "not logged in" : "");
  document.getElementById("login-open").hidden = !s.loginRequired || !!s.user;
  document.getElementById("logout").hidden = !s.user;
}
function refreshSession() { fetch("/api/session").then(r => r.json()).then(showSession); }
document.getElementById("login-open").addEventListener("click", () => {
  showError("login-error", "");
  document.getElementById("login").showModal();
});
document.getElementById("login-ok").addEventListener("click", async ev => {
  ev.preventDefault();
  const body = {user: document.getElementById("login-user").value, password: document.getElementById("login-password").value};
  const r = await fetch("/api/login", {method: "POST", headers: WRITE_HEADERS, body: JSON.stringify(body)});
  const answer = await r.json();
  document.getElementById("login-password").value = "";
  if (answer.error) { showError("login-error", answer.error); return; }
  document.getElementById("login").close();
  showSession(answer);
});
document.getElementById("logout").addEventListener("click", async () => {
  const r = await fetch("/api/logout", {method: "POST", headers: WRITE_HEADERS, body: "{}"});
  showSession(await r.json());
});
refreshSession();

showTab();
connect();
