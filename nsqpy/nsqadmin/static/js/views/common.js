// Pieces shared by the topic, channel and node pages.

import { html } from "../html.js";
import { badge } from "../ui.js";
import { encNode } from "../api.js";
import { nanos, quantileLabel } from "../format.js";

export function lastValue(values) {
  if (!values) return null;
  for (let i = values.length - 1; i >= 0; i--) {
    if (values[i] !== null && values[i] !== undefined) return values[i];
  }
  return null;
}

// e2e processing latency percentiles, highest quantile first: "p99 12ms · p95 8ms"
export function e2e(latency) {
  const ps = (latency && latency.percentiles) || [];
  if (!ps.length) return html`<span class="muted">–</span>`;
  return html`<span class="e2e">${ps.map(
    (p, i) => html`${i ? html`<span class="muted"> · </span>` : ""}<span title="max across nodes">${quantileLabel(p.quantile)} ${nanos(p.max ?? p.value)}</span>`,
  )}</span>`;
}

export function hasE2E(items) {
  return items.some((i) => i.e2e_processing_latency && (i.e2e_processing_latency.percentiles || []).length);
}

export function nodeLink(node, hostname) {
  const host = hostname && hostname !== node.split(":")[0] ? html`<span class="muted host-sub">${hostname}</span>` : "";
  return html`<a href="nodes/${encNode(node)}" data-link>${node}</a>${host}`;
}

// Topology (NSQ master's experiment): "region r1" and "zone z1" badges, those that are set.
export function topologyBadges(region, zone) {
  return [region ? badge(`region ${region}`) : "", zone ? badge(`zone ${zone}`) : ""].filter(Boolean);
}

// The same badges after a cell's text (nothing when neither is set).
export function topologyLabel(region, zone) {
  const out = topologyBadges(region, zone);
  return out.length ? html` <span class="badges">${out}</span>` : "";
}

export function historyNote(config) {
  return config.sampleInterval > 0 ? "" : "Charts are off (--sample-interval=0).";
}
