// One topic: its queue on each nsqd, its channels, charts and the topic actions.

import { get, post, del, enc, ApiError } from "../api.js";
import { html } from "../html.js";
import { num, rate } from "../format.js";
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
import { e2e, hasE2E, lastValue, nodeLink } from "./common.js";
import { policyAction, policyCard } from "./policy.js";

function actions(topic) {
  if (!config.isAdmin) return "";
  return html`${topic.paused ? button("Unpause", "unpause", { kind: "primary" }) : button("Pause", "pause", { kind: "warning" })}
    ${button("Empty Queue", "empty")}
    ${button("Delete Topic", "delete", { kind: "danger" })}`;
}

function nodesTable(topic, name) {
  if (!topic.nodes.length) {
    return empty("No nsqd produces this topic right now (it is only registered with nsqlookupd).");
  }
  const showE2E = hasE2E(topic.nodes);
  const canTombstone = config.isAdmin && config.nsqlookupd.length > 0;
  const rows = topic.nodes.map(
    (n) => html`<tr data-node="${n.node}">
      <td class="name">${nodeLink(n.node, n.hostname)} ${n.paused ? badge("paused", "warning") : ""}</td>
      <td class="num" data-col="depth">${num(n.depth)}</td>
      <td class="num">${depthSplit(n.memory_depth, n.backend_depth)}</td>
      <td class="num" data-col="messages">${num(n.message_count)}</td>
      <td class="num">${num(n.channels.length)}</td>
      ${showE2E ? html`<td>${e2e(n.e2e_processing_latency)}</td>` : ""}
      ${canTombstone ? html`<td class="row-actions">${button("Tombstone", "tombstone", { kind: "ghost", data: { node: n.node } })}</td>` : ""}
    </tr>`,
  );
  return html`<div class="table-wrap"><table class="table">
    <thead><tr><th>NSQd host</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
      <th class="num">Messages</th><th class="num">Channels</th>${showE2E ? html`<th>E2E latency</th>` : ""}
      ${canTombstone ? html`<th></th>` : ""}</tr></thead>
    <tbody>${rows}</tbody>
    ${topic.nodes.length > 1
      ? html`<tfoot><tr class="total"><td>Total</td><td class="num">${num(topic.depth)}</td>
        <td class="num">${depthSplit(topic.memory_depth, topic.backend_depth)}</td>
        <td class="num">${num(topic.message_count)}</td><td class="num">${num(topic.channels.length)}</td>
        ${showE2E ? html`<td>${e2e(topic.e2e_processing_latency)}</td>` : ""}${canTombstone ? html`<td></td>` : ""}</tr></tfoot>`
      : ""}
  </table></div>`;
}

function channelsTable(topic, name, history) {
  if (!topic.channels.length) return empty("No channels. Messages are kept until a channel is created.");
  const showE2E = hasE2E(topic.channels);
  const rows = topic.channels.map((c) => {
    const series = history && history.channels[c.channel_name] ? history.channels[c.channel_name].series : null;
    return html`<tr data-channel="${c.channel_name}">
      <td class="name"><a href="topics/${enc(name)}/${enc(c.channel_name)}" data-link>${c.channel_name}</a>
        ${c.paused ? badge("paused", "warning") : ""}</td>
      <td class="num" data-col="depth">${num(c.depth)}</td>
      <td class="num">${depthSplit(c.memory_depth, c.backend_depth)}</td>
      <td class="num" data-col="in_flight">${num(c.in_flight_count)}</td>
      <td class="num" data-col="deferred">${num(c.deferred_count)}</td>
      <td class="num" data-col="requeued">${num(c.requeue_count)}</td>
      <td class="num" data-col="timed_out">${num(c.timeout_count)}</td>
      <td class="num" data-col="messages">${num(c.message_count)}</td>
      <td class="num" data-col="connections">${num(c.client_count)}</td>
      <td class="num">${series ? rate(lastValue(series.rate)) : "–"}</td>
      ${showE2E ? html`<td>${e2e(c.e2e_processing_latency)}</td>` : ""}
    </tr>`;
  });
  return html`<div class="table-wrap"><table class="table">
    <thead><tr><th>Channel</th><th class="num">Depth</th><th class="num">Memory + Disk</th>
      <th class="num">In-Flight</th><th class="num">Deferred</th><th class="num">Requeued</th>
      <th class="num">Timed Out</th><th class="num">Messages</th><th class="num">Connections</th>
      <th class="num">Rate</th>${showE2E ? html`<th>E2E latency</th>` : ""}</tr></thead>
    <tbody>${rows}</tbody>
  </table></div>`;
}

function charts(history) {
  if (!(config.sampleInterval > 0)) return "";
  const t = (history && history.timestamps) || [];
  const s = (history && history.series) || { rate: [], depth: [] };
  const channelNames = history ? Object.keys(history.channels) : [];
  return html`<div class="charts">
    ${chart({ title: "Message rate", timestamps: t, series: [{ label: "messages/s", values: s.rate }], kind: "rate" })}
    ${chart({ title: "Topic depth", timestamps: t, series: [{ label: "depth", values: s.depth }] })}
    ${chart({
      title: "Channel depth",
      timestamps: t,
      series: channelNames.map((c) => ({ label: c, values: history.channels[c].series.depth })),
      note: channelNames.length ? "" : "No channels",
    })}
  </div>`;
}

export default {
  title: ([name]) => name,
  refreshes: true,
  mount(root, [name], ctx) {
    let topic = null;
    root.addEventListener("click", async (event) => {
      const btn = event.target.closest("button[data-action]");
      if (!btn || !topic) return;
      const action = btn.dataset.action;
      const path = `api/topics/${enc(name)}`;
      const subject = html`<strong>${name}</strong>`.text;
      if (action === "set_policy" || action === "clear_policy") {
        if (await policyAction(action, path, "topic", subject)) await ctx.refreshNow();
        return;
      }
      let ok = false;
      if (action === "delete") {
        ok = await runAction({
          title: "Delete topic",
          body: `Delete topic ${subject} and all its channels from every nsqd and nsqlookupd? Queued messages are lost.`,
          confirmLabel: "Delete Topic",
          call: () => del(path),
          done: `Topic ${name} deleted.`,
        });
        if (ok) window.nsqadmin.navigate("./");
        return;
      }
      if (action === "tombstone") {
        const node = btn.dataset.node;
        ok = await runAction({
          title: "Tombstone topic producer",
          body: `Tombstone ${html`<strong>${node}</strong>`.text} for topic ${subject}? The topic is deleted on that nsqd and hidden from lookups there for a while.`,
          confirmLabel: "Tombstone",
          call: () => del(`api/nodes/${enc(node)}`, { topic: name }),
          done: `Tombstoned ${node} for ${name}.`,
        });
      } else {
        const labels = { pause: "Pause", unpause: "Unpause", empty: "Empty" };
        const bodies = {
          pause: `Pause topic ${subject}? Messages stay queued on the topic and are not copied to its channels.`,
          unpause: `Unpause topic ${subject}?`,
          empty: `Empty the queue of topic ${subject}? Messages not yet copied to channels are lost.`,
        };
        ok = await runAction({
          title: `${labels[action]} topic`,
          body: bodies[action],
          confirmLabel: labels[action],
          danger: action !== "unpause",
          call: () => post(path, { action }),
          done: `Topic ${name}: ${action} done.`,
        });
      }
      if (ok) await ctx.refreshNow();
    });

    return {
      async refresh() {
        let history = null;
        try {
          [topic, history] = await Promise.all([
            get(`api/topics/${enc(name)}`),
            config.sampleInterval > 0 ? get(`api/history?topic=${enc(name)}`).catch(() => null) : null,
          ]);
        } catch (err) {
          if (err instanceof ApiError && /TOPIC_NOT_FOUND/.test(err.message)) {
            topic = null;
            root.innerHTML = html`${crumbs([{ label: "Streams", href: "./" }, { label: name }])}
              ${pageHeader({ title: name })}
              <div class="banner banner-info">Topic <strong>${name}</strong> does not exist (any more).</div>`.text;
            return;
          }
          throw err;
        }
        topic.nodes = topic.nodes || [];
        topic.channels = topic.channels || [];
        const rateNow = history ? lastValue(history.series.rate) : null;
        const badges = [
          topic.paused ? badge("paused", "warning") : "",
          name.endsWith("#ephemeral") ? badge("ephemeral") : "",
        ];
        root.innerHTML = html`
          ${crumbs([{ label: "Streams", href: "./" }, { label: name }])}
          ${pageHeader({ title: name, subtitle: "Topic", badges, actions: actions(topic) })}
          ${warningBanner(topic.message)}
          ${tiles([
            { id: "depth", label: "Depth", value: num(topic.depth), hint: html`${num(topic.memory_depth)} memory + ${num(topic.backend_depth)} disk` },
            { id: "messages", label: "Messages", value: num(topic.message_count) },
            { id: "rate", label: "Rate", value: rate(rateNow) },
            { id: "channels", label: "Channels", value: num(topic.channels.length) },
            { id: "nodes", label: "NSQd", value: num(topic.nodes.length) },
          ])}
          ${charts(history)}
          ${policyCard(topic, "topic")}
          ${card("Topic message queues", nodesTable(topic, name), { id: "topic-nodes" })}
          ${card("Channels", channelsTable(topic, name, history), { id: "topic-channels" })}
        `.text;
      },
    };
  },
};
