// One nsqd: its topics with their channels, its consumers, memory and charts.

import { get, del, enc } from "../api.js";
import { html } from "../html.js";
import { num, rate, seconds, compact } from "../format.js";
import { chart } from "../chart.js";
import { config, crumbs, pageHeader, badge, tiles, card, empty, warningBanner, depthSplit, button, runAction } from "../ui.js";
import { e2e, hasE2E, lastValue, topologyBadges, topologyLabel } from "./common.js";

function topicsTable(doc) {
  const topics = doc.topics || [];
  if (!topics.length) return empty("This nsqd has no topics.");
  const canTombstone = config.isAdmin && config.nsqlookupd.length > 0;
  const showE2E = hasE2E(topics) || topics.some((t) => hasE2E(t.channels || []));
  const rows = [];
  for (const t of topics) {
    rows.push(html`<tr class="group" data-topic="${t.topic_name}">
      <td class="name"><a href="topics/${enc(t.topic_name)}" data-link>${t.topic_name}</a> ${t.paused ? badge("paused", "warning") : ""}</td>
      <td class="num" data-col="depth">${num(t.depth)}</td>
      <td class="num">${depthSplit(t.memory_depth, t.backend_depth)}</td>
      <td class="num"></td><td class="num"></td><td class="num"></td><td class="num"></td>
      <td class="num" data-col="messages">${num(t.message_count)}</td>
      <td class="num"></td>
      ${showE2E ? html`<td>${e2e(t.e2e_processing_latency)}</td>` : ""}
      ${canTombstone ? html`<td class="row-actions">${button("Tombstone", "tombstone", { kind: "ghost", data: { topic: t.topic_name } })}</td>` : ""}
    </tr>`);
    for (const c of t.channels || []) {
      rows.push(html`<tr class="child" data-channel="${t.topic_name}/${c.channel_name}">
        <td class="name"><span class="indent">↳</span><a href="topics/${enc(t.topic_name)}/${enc(c.channel_name)}" data-link>${c.channel_name}</a>
          ${c.paused ? badge("paused", "warning") : ""}</td>
        <td class="num">${num(c.depth)}</td>
        <td class="num">${depthSplit(c.memory_depth, c.backend_depth)}</td>
        <td class="num">${num(c.in_flight_count)}</td>
        <td class="num">${num(c.deferred_count)}</td>
        <td class="num">${num(c.requeue_count)}</td>
        <td class="num">${num(c.timeout_count)}</td>
        <td class="num">${num(c.message_count)}</td>
        <td class="num">${num(c.client_count)}</td>
        ${showE2E ? html`<td>${e2e(c.e2e_processing_latency)}</td>` : ""}
        ${canTombstone ? html`<td></td>` : ""}
      </tr>`);
    }
  }
  return html`<div class="table-wrap"><table class="table table-grouped">
    <thead><tr><th>Topic / channel</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
      <th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>
      <th class="num">Timed Out</th><th class="num">Messages</th><th class="num">Connections</th>
      ${showE2E ? html`<th>E2E latency</th>` : ""}${canTombstone ? html`<th></th>` : ""}</tr></thead>
    <tbody>${rows}</tbody>
  </table></div>`;
}

function clientsTable(doc) {
  const rows = [];
  for (const t of doc.topics || []) {
    for (const c of t.channels || []) {
      for (const cl of c.clients || []) {
        rows.push(html`<tr>
          <td class="name">${cl.hostname || cl.remote_address} <span class="muted host-sub">${cl.remote_address}</span></td>
          <td><a href="topics/${enc(t.topic_name)}/${enc(c.channel_name)}" data-link>${t.topic_name}/${c.channel_name}</a></td>
          <td class="ua">${cl.user_agent || cl.version}${topologyLabel(cl.topology_region, cl.topology_zone)}</td>
          <td class="num">${num(cl.ready_count)}</td>
          <td class="num">${num(cl.in_flight_count)}</td>
          <td class="num">${num(cl.finish_count)}</td>
          <td class="num">${num(cl.requeue_count)}</td>
          <td class="num">${num(cl.message_count)}</td>
          <td class="num">${seconds(cl.connected / 1e9)}</td>
        </tr>`);
      }
    }
  }
  if (!rows.length) return empty("No consumers connected.");
  return html`<div class="table-wrap"><table class="table">
    <thead><tr><th>Client host</th><th>Topic / channel</th><th>User-Agent</th><th class="num">Ready</th>
      <th class="num">In-Flight</th><th class="num">Finished</th><th class="num">Requeued</th>
      <th class="num">Messages</th><th class="num">Connected</th></tr></thead>
    <tbody>${rows}</tbody></table></div>`;
}

function bytes(n) {
  return n === null || n === undefined ? "–" : `${compact(n)}B`;
}

function memory(doc) {
  const m = doc.memory;
  if (!m) return "";
  const items = [
    ["Heap objects", compact(m.heap_objects)],
    ["Heap in use", bytes(m.heap_in_use_bytes)],
    ["Heap idle", bytes(m.heap_idle_bytes)],
    ["Heap released", bytes(m.heap_released_bytes)],
    ["Next GC", compact(m.next_gc_bytes)],
    ["GC runs", num(m.gc_total_runs)],
    ["GC pause p95 / p99 / max", `${num(m.gc_pause_usec_95)} / ${num(m.gc_pause_usec_99)} / ${num(m.gc_pause_usec_100)} µs`],
  ];
  return card(
    "Memory",
    html`<dl class="kv">${items.map(([k, v]) => html`<div><dt>${k}</dt><dd>${v}</dd></div>`)}</dl>`,
    { id: "node-memory" },
  );
}

export default {
  title: ([node]) => node,
  refreshes: true,
  mount(root, [node], ctx) {
    root.addEventListener("click", async (event) => {
      const btn = event.target.closest('button[data-action="tombstone"]');
      if (!btn) return;
      const topic = btn.dataset.topic;
      const ok = await runAction({
        title: "Tombstone topic producer",
        body: html`Tombstone <strong>${node}</strong> for topic <strong>${topic}</strong>? The topic is deleted on this nsqd and hidden from lookups here for a while.`.text,
        confirmLabel: "Tombstone",
        call: () => del(`api/nodes/${enc(node)}`, { topic }),
        done: `Tombstoned ${node} for ${topic}.`,
      });
      if (ok) await ctx.refreshNow();
    });
    return {
      async refresh() {
        const [doc, history] = await Promise.all([
          get(`api/nodes/${enc(node)}`),
          config.sampleInterval > 0 ? get(`api/history?node=${enc(node)}`).catch(() => null) : null,
        ]);
        const p = doc.producer || {};
        const topics = doc.topics || [];
        const channels = topics.reduce((n, t) => n + (t.channels || []).length, 0);
        const depth = topics.reduce((n, t) => n + t.depth, 0);
        const t = (history && history.timestamps) || [];
        const s = (history && history.series) || { rate: [], depth: [] };
        root.innerHTML = html`
          ${crumbs([{ label: "Nodes", href: "nodes" }, { label: node }])}
          ${pageHeader({
            title: p.hostname || node,
            subtitle: html`${node} · TCP ${p.tcp_port} · nsqd v${p.version}`,
            badges: [p.out_of_date ? badge("out of date", "warning") : "", ...topologyBadges(p.topology_region, p.topology_zone)],
          })}
          ${warningBanner(doc.message)}
          ${tiles([
            { id: "topics", label: "Topics", value: num(topics.length) },
            { id: "channels", label: "Channels", value: num(channels) },
            { id: "depth", label: "Depth", value: num(depth) },
            { id: "messages", label: "Messages", value: num(doc.total_messages), hint: history ? rate(lastValue(s.rate)) : "" },
            { id: "clients", label: "Clients", value: num(doc.total_clients) },
          ])}
          ${config.sampleInterval > 0
            ? html`<div class="charts">
                ${chart({ title: "Message rate", timestamps: t, series: [{ label: "messages/s", values: s.rate }], kind: "rate" })}
                ${chart({ title: "Depth", timestamps: t, series: [{ label: "depth", values: s.depth }] })}
              </div>`
            : ""}
          ${card("Topics and channels", topicsTable(doc), { id: "node-topics" })}
          ${card("Client connections", clientsTable(doc), { id: "node-clients" })}
          ${memory(doc)}
        `.text;
      },
    };
  },
};
