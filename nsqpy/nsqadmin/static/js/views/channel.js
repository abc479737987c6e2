// One channel: totals, each nsqd's share, the consumers connected, charts and actions.

import { get, post, del, enc } from "../api.js";
import { html } from "../html.js";
import { num, rate, seconds } from "../format.js";
import { chart } from "../chart.js";
import {
  config,
  crumbs,
  pageHeader,
  badge,
  tiles,
  card,
  empty,
  warningBanner,
  depthSplit,
  button,
  runAction,
} from "../ui.js";
import { e2e, hasE2E, lastValue, nodeLink, topologyBadges, topologyLabel } from "./common.js";
import { policyAction, policyCard } from "./policy.js";

function actions(channel) {
  if (!config.isAdmin) return "";
  return html`${channel.paused ? button("Unpause", "unpause", { kind: "primary" }) : button("Pause", "pause", { kind: "warning" })}
    ${button("Empty Queue", "empty")}
    ${button("Delete Channel", "delete", { kind: "danger" })}`;
}

// Topology-aware consumption's delivery counters (nsqd omits them when zero).
const LOCALITY = ["zone_local_msg_count", "region_local_msg_count", "global_msg_count"];
const hasLocality = (rows) => rows.some((c) => LOCALITY.some((k) => c[k] > 0));
const locality = (c) => html`${LOCALITY.map((k, i) => html`${i ? " / " : ""}<span data-count="${k}">${num(c[k] || 0)}</span>`)}`;

function nodesTable(channel) {
  const nodes = channel.nodes || [];
  if (!nodes.length) return empty("No nsqd has this channel right now.");
  const showE2E = hasE2E(nodes);
  const showLocality = hasLocality(nodes);
  const row = (c, total) => html`<tr${total ? html` class="total"` : html` data-node="${c.node}"`}>
    <td class="name">${total ? "Total" : nodeLink(c.node, c.hostname)} ${!total && c.paused ? badge("paused", "warning") : ""}</td>
    <td class="num" data-col="depth">${num(c.depth)}</td>
    <td class="num">${depthSplit(c.memory_depth, c.backend_depth)}</td>
    <td class="num" data-col="in_flight">${num(c.in_flight_count)}</td>
    <td class="num" data-col="deferred">${num(c.deferred_count)}</td>
    <td class="num" data-col="requeued">${num(c.requeue_count)}</td>
    <td class="num" data-col="timed_out">${num(c.timeout_count)}</td>
    <td class="num" data-col="messages">${num(c.message_count)}</td>
    <td class="num" data-col="connections">${num(c.client_count)}</td>
    ${showLocality ? html`<td class="num" data-col="locality">${locality(c)}</td>` : ""}
    ${showE2E ? html`<td>${e2e(c.e2e_processing_latency)}</td>` : ""}
  </tr>`;
  return html`<div class="table-wrap"><table class="table">
    <thead><tr><th>NSQd host</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
      <th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>
      <th class="num">Timed Out</th><th class="num">Messages</th><th class="num">Connections</th>
      ${showLocality ? html`<th class="num" title="deliveries to zone-local / region-local / other consumers">Zone / Region / Global</th>` : ""}
      ${showE2E ? html`<th>E2E latency</th>` : ""}</tr></thead>
    <tbody>${nodes.map((n) => row(n, false))}</tbody>
    ${nodes.length > 1 ? html`<tfoot>${row(channel, true)}</tfoot>` : ""}
  </table></div>`;
}

function attributes(c) {
  const out = [];
  if (c.tls) out.push(badge(c.tls_version || "TLS", "info", c.tls_cipher_suite));
  if (c.snappy) out.push(badge("snappy"));
  if (c.deflate) out.push(badge("deflate"));
  if (c.sample_rate > 0) out.push(badge(`sampled ${c.sample_rate}%`));
  if (c.authed) out.push(badge(c.auth_identity ? `auth: ${c.auth_identity}` : "authed", "success"));
  out.push(...topologyBadges(c.topology_region, c.topology_zone));
  return out.length ? html`<span class="badges">${out}</span>` : html`<span class="muted">–</span>`;
}

function clientsTable(channel) {
  const clients = channel.clients || [];
  if (!clients.length) return empty("No consumers connected.");
  const rows = clients.map(
    (c) => html`<tr data-client="${c.client_id}">
      <td class="name"><span title="${c.remote_address}">${c.hostname || c.remote_address}</span>
        <span class="muted host-sub">${c.remote_address}</span></td>
      <td class="ua">${c.user_agent || html`<span class="muted">${c.version}</span>`}</td>
      <td>${attributes(c)}</td>
      <td>${nodeLink(c.node)}${topologyLabel(c.node_topology_region, c.node_topology_zone)}</td>
      <td class="num" data-col="ready">${num(c.ready_count)}</td>
      <td class="num" data-col="in_flight">${num(c.in_flight_count)}</td>
      <td class="num" data-col="finished">${num(c.finish_count)}</td>
      <td class="num" data-col="requeued">${num(c.requeue_count)}</td>
      <td class="num" data-col="messages">${num(c.message_count)}</td>
      <td class="num" title="since ${new Date(c.connect_ts * 1000).toLocaleString()}">${seconds(c.connected / 1e9)}</td>
    </tr>`,
  );
  return html`<div class="table-wrap"><table class="table">
    <thead><tr><th>Client host</th><th>User-Agent</th><th>Attributes</th><th>NSQd host</th>
      <th class="num">Ready</th><th class="num">In-Flight</th><th class="num">Finished</th>
      <th class="num">Requeued</th><th class="num">Messages</th><th class="num">Connected</th></tr></thead>
    <tbody>${rows}</tbody>
  </table></div>`;
}

function charts(history) {
  if (!(config.sampleInterval > 0)) return "";
  const t = (history && history.timestamps) || [];
  const s = (history && history.series) || {};
  const v = (k) => s[k] || [];
  return html`<div class="charts charts-2">
    ${chart({ title: "Message rate", timestamps: t, series: [{ label: "messages/s", values: v("rate") }], kind: "rate" })}
    ${chart({ title: "Depth", timestamps: t, series: [{ label: "depth", values: v("depth") }] })}
    ${chart({
      title: "In-flight and deferred",
      timestamps: t,
      series: [
        { label: "in-flight", values: v("in_flight") },
        { label: "deferred", values: v("deferred") },
      ],
    })}
    ${chart({
      title: "Requeues and timeouts",
      timestamps: t,
      series: [
        { label: "requeued/s", values: v("requeue_rate"), color: "#d97706" },
        { label: "timed out/s", values: v("timeout_rate"), color: "#dc2626" },
      ],
      kind: "rate",
    })}
  </div>`;
}

export default {
  title: ([topic, channel]) => `${topic} / ${channel}`,
  refreshes: true,
  mount(root, [topicName, name], ctx) {
    let channel = null;
    root.addEventListener("click", async (event) => {
      const btn = event.target.closest("button[data-action]");
      if (!btn || !channel) return;
      const action = btn.dataset.action;
      const path = `api/topics/${enc(topicName)}/${enc(name)}`;
      const subject = html`<strong>${topicName}/${name}</strong>`.text;
      if (action === "set_policy" || action === "clear_policy") {
        if (await policyAction(action, path, "channel", subject)) await ctx.refreshNow();
        return;
      }
      if (action === "delete") {
        const ok = await runAction({
          title: "Delete channel",
          body: `Delete channel ${subject} from every nsqd and nsqlookupd? Its queued messages are lost.`,
          confirmLabel: "Delete Channel",
          call: () => del(path),
          done: `Channel ${topicName}/${name} deleted.`,
        });
        if (ok) window.nsqadmin.navigate(`topics/${enc(topicName)}`);
        return;
      }
      const labels = { pause: "Pause", unpause: "Unpause", empty: "Empty" };
      const bodies = {
        pause: `Pause channel ${subject}? Messages keep queueing but are not delivered to its consumers.`,
        unpause: `Unpause channel ${subject}?`,
        empty: `Empty the queue of channel ${subject}? Queued messages are lost (in-flight ones are kept).`,
      };
      const ok = await runAction({
        title: `${labels[action]} channel`,
        body: bodies[action],
        confirmLabel: labels[action],
        danger: action !== "unpause",
        call: () => post(path, { action }),
        done: `Channel ${topicName}/${name}: ${action} done.`,
      });
      if (ok) await ctx.refreshNow();
    });

    return {
      async refresh() {
        const [doc, history] = await Promise.all([
          get(`api/topics/${enc(topicName)}/${enc(name)}`),
          config.sampleInterval > 0
            ? get(`api/history?topic=${enc(topicName)}&channel=${enc(name)}`).catch(() => null)
            : null,
        ]);
        const trail = crumbs([
          { label: "Streams", href: "./" },
          { label: topicName, href: `topics/${enc(topicName)}` },
          { label: name },
        ]);
        if (!doc.channel_name) {
          channel = null;
          root.innerHTML = html`${trail}${pageHeader({ title: name, subtitle: `Channel of ${topicName}` })}
            ${warningBanner(doc.message)}
            <div class="banner banner-info">Channel <strong>${name}</strong> does not exist on any nsqd of topic ${topicName}.</div>`.text;
          return;
        }
        channel = doc;
        const rateNow = history ? lastValue(history.series.rate) : null;
        root.innerHTML = html`
          ${trail}
          ${pageHeader({
            title: name,
            subtitle: html`Channel of <a href="topics/${enc(topicName)}" data-link>${topicName}</a>`,
            badges: [channel.paused ? badge("paused", "warning") : "", name.endsWith("#ephemeral") ? badge("ephemeral") : ""],
            actions: actions(channel),
          })}
          ${warningBanner(channel.message)}
          ${tiles([
            { id: "depth", label: "Depth", value: num(channel.depth), hint: html`${num(channel.memory_depth)} memory + ${num(channel.backend_depth)} disk` },
            { id: "in_flight", label: "In-Flight", value: num(channel.in_flight_count) },
            { id: "deferred", label: "Deferred", value: num(channel.deferred_count) },
            { id: "requeued", label: "Requeued", value: num(channel.requeue_count) },
            { id: "timed_out", label: "Timed Out", value: num(channel.timeout_count) },
            { id: "messages", label: "Messages", value: num(channel.message_count), hint: rate(rateNow) },
            { id: "connections", label: "Connections", value: num(channel.client_count) },
            ...(hasLocality([channel])
              ? [{ id: "locality", label: "Zone / Region / Global", value: locality(channel) }]
              : []),
          ])}
          ${charts(history)}
          ${policyCard(channel, "channel")}
          ${card("Channel on each nsqd", nodesTable(channel), { id: "channel-nodes" })}
          ${card("Client connections", clientsTable(channel), { id: "channel-clients" })}
        `.text;
      },
    };
  },
};
