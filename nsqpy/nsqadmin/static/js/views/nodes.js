// Nodes: every nsqd, as the nsqlookupd see it (or as given with --nsqd-http-address).

import { get, enc, encNode } from "../api.js";
import { html } from "../html.js";
import { num } from "../format.js";
import { config, pageHeader, badge, card, empty, warningBanner } from "../ui.js";

export default {
  title: () => "Nodes",
  refreshes: true,
  mount(root) {
    return {
      async refresh() {
        const doc = await get("api/nodes");
        const nodes = doc.nodes || [];
        const lookupds = config.nsqlookupd.length;
        const rows = nodes.map((n) => {
          const addr = `${n.broadcast_address}:${n.http_port}`;
          const inconsistent = lookupds > 0 && n.remote_addresses.length !== lookupds;
          const topics = n.topics || [];
          return html`<tr data-node="${addr}">
            <td class="name"><a href="nodes/${encNode(addr)}" data-link>${n.hostname || addr}</a>
              <span class="muted host-sub">${addr}</span></td>
            <td>${n.broadcast_address}</td>
            <td class="num">${n.tcp_port}</td>
            <td class="num">${n.http_port}</td>
            <td>${n.version} ${n.out_of_date ? badge("out of date", "warning", "older than the newest nsqd of the cluster") : ""}</td>
            <td>${n.topology_zone || html`<span class="muted">–</span>`}</td>
            <td>${n.topology_region || html`<span class="muted">–</span>`}</td>
            ${lookupds
              ? html`<td class="num" title="${n.remote_addresses.join("\n")}">${num(n.remote_addresses.length)}
                  ${inconsistent ? badge("inconsistent", "danger", "not registered with every nsqlookupd, or several nsqd share this broadcast address") : ""}</td>`
              : ""}
            <td class="topics-cell">${topics.length
              ? topics.map((t) =>
                  t.tombstoned
                    ? html`<span class="chip chip-tombstoned" title="tombstoned on nsqlookupd">${t.topic}</span>`
                    : html`<a class="chip" href="topics/${enc(t.topic)}" data-link>${t.topic}</a>`,
                )
              : html`<span class="muted">none</span>`}</td>
          </tr>`;
        });
        const count = nodes.length;
        root.innerHTML = html`
          ${pageHeader({ title: "Nodes", subtitle: `${count} nsqd${lookupds ? ` registered with ${lookupds} nsqlookupd` : ""}` })}
          ${warningBanner(doc.message)}
          ${card(
            "NSQd nodes",
            nodes.length
              ? html`<div class="table-wrap"><table class="table">
                  <thead><tr><th>Hostname</th><th>Broadcast address</th><th class="num">TCP port</th>
                    <th class="num">HTTP port</th><th>Version</th><th>Zone</th><th>Region</th>
                    ${lookupds ? html`<th class="num">Lookupd conns</th>` : ""}<th>Topics</th></tr></thead>
                  <tbody>${rows}</tbody></table></div>`
              : empty("No nsqd is registered."),
          )}`.text;
      },
    };
  },
};
