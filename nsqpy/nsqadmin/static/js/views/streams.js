// Streams: every topic in the cluster, with its latest sampled depth, messages and rate.

import { get, enc } from "../api.js";
import { html } from "../html.js";
import { num, rate, ago } from "../format.js";
import { sparkline } from "../chart.js";
import { config, pageHeader, badge, empty, warningBanner } from "../ui.js";

function lastRate(series) {
  const values = (series && series.rate) || [];
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}

export default {
  title: () => "Streams",
  refreshes: true,
  mount(root) {
    root.innerHTML = html`
      <div data-region="header"></div>
      <div data-region="warning"></div>
      <section class="card">
        <div class="card-header">
          <h2>Topics</h2>
          <div class="card-tools">
            <input type="search" class="input input-sm" placeholder="Filter topics…" data-role="filter" aria-label="Filter topics">
            ${config.isAdmin && config.nsqlookupd.length ? html`<a class="btn btn-sm" href="lookup#create" data-link>New topic</a>` : ""}
          </div>
        </div>
        <div data-region="table"></div>
      </section>`.text;
    const region = (name) => root.querySelector(`[data-region="${name}"]`);
    const filter = root.querySelector('[data-role="filter"]');
    let state = null;

    function renderTable() {
      if (!state) return;
      const { topics, history } = state;
      const needle = filter.value.trim().toLowerCase();
      const shown = topics.filter((t) => t.toLowerCase().includes(needle));
      const sampled = history && history.interval > 0;
      if (!topics.length) {
        region("table").innerHTML = empty("No topics yet. Publish a message or create a topic to see it here.").text;
        return;
      }
      if (!shown.length) {
        region("table").innerHTML = empty("No topic matches this filter.").text;
        return;
      }
      const rows = shown.map((name) => {
        const h = (history && history.topics[name]) || null;
        return html`<tr data-topic="${name}">
          <td class="name"><a href="topics/${enc(name)}" data-link>${name}</a>
            ${h && h.paused ? badge("paused", "warning") : ""}
            ${name.endsWith("#ephemeral") ? badge("ephemeral") : ""}</td>
          <td class="num">${h ? num(h.channel_count) : "–"}</td>
          <td class="num" data-col="depth">${h ? num(h.depth) : "–"}</td>
          <td class="num" data-col="messages">${h ? num(h.message_count) : "–"}</td>
          <td class="num" data-col="rate">${h ? rate(lastRate(h.series)) : "–"}</td>
          ${sampled ? html`<td class="spark-cell">${h ? sparkline(h.series.rate) : ""}</td>` : ""}
        </tr>`;
      });
      region("table").innerHTML = html`<div class="table-wrap"><table class="table">
        <thead><tr>
          <th>Topic</th><th class="num">Channels</th><th class="num">Depth</th>
          <th class="num">Messages</th><th class="num">Rate</th>${sampled ? html`<th>Trend</th>` : ""}
        </tr></thead>
        <tbody>${rows}</tbody>
      </table></div>`.text;
    }

    filter.addEventListener("input", renderTable);

    return {
      async refresh() {
        const [topicsDoc, history] = await Promise.all([
          get("api/topics"),
          config.sampleInterval > 0 ? get("api/history").catch(() => null) : Promise.resolve(null),
        ]);
        state = { topics: topicsDoc.topics || [], history };
        const count = state.topics.length;
        const when = history && history.sampled_at ? ` · sampled ${ago(history.sampled_at)}` : "";
        region("header").innerHTML = pageHeader({
          title: "Streams",
          subtitle: `${count} topic${count === 1 ? "" : "s"}${when}`,
        }).text;
        region("warning").innerHTML = warningBanner(topicsDoc.message).text;
        renderTable();
      },
    };
  },
};
