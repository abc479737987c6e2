// Message policies (docs/POLICIES.md) on the topic and channel pages: the effective policy,
// its counters, where a dead-letter topic's messages came from, and set / clear actions
// (admins only, behind the confirmation dialog like every other action).

import { post, enc } from "../api.js";
import { html } from "../html.js";
import { num } from "../format.js";
import { config, card, button, confirmAction, flash } from "../ui.js";

const FIELDS = {
  channel: ["max_attempts", "dead_letter_topic", "message_ttl", "max_depth"],
  topic: ["dead_letter_topic", "message_ttl", "max_depth"],
};
const NUMBERS = new Set(["max_attempts", "max_depth"]);

function sourceLink(source) {
  const [topic, channel] = source.split(":");
  return channel
    ? html`<a href="topics/${enc(topic)}/${enc(channel)}" data-link>${topic}/${channel}</a>`
    : html`<a href="topics/${enc(topic)}" data-link>${topic}</a>`;
}

// The card: "" when nothing about policies is known and the user cannot set one.
export function policyCard(doc, kind) {
  const policy = doc.policy;
  const sources = doc.dead_letter_sources || [];
  if (!policy && !sources.length && !config.isAdmin && doc.expired_count === undefined) return "";
  const rows = policy
    ? FIELDS[kind].map((k) => {
        const v = policy[k];
        const shown = k === "dead_letter_topic" && v ? html`<a href="topics/${enc(v)}" data-link>${v}</a>` : String(v);
        return html`<tr><td class="name">${k}</td><td>${shown}</td></tr>`;
      })
    : [];
  const counted = doc.dead_letter_count || doc.expired_count || doc.overflow_count;
  const counts = doc.expired_count === undefined || (!policy && !counted)
    ? ""
    : html`<p class="policy-counts" style="padding: 0 16px">${kind === "channel" ? html`dead-lettered <strong data-col="dead_letter_count">${num(doc.dead_letter_count)}</strong> · ` : ""}expired <strong data-col="expired_count">${num(doc.expired_count)}</strong> · overflowed <strong data-col="overflow_count">${num(doc.overflow_count)}</strong></p>`;
  const from = sources.length
    ? html`<p class="policy-sources" style="padding: 0 16px">Dead-letter topic of ${sources.map((s, i) => html`${i ? ", " : ""}${sourceLink(s)}`)}</p>`
    : "";
  const body = html`${from}${rows.length ? html`<div class="table-wrap"><table class="table"><tbody>${rows}</tbody></table></div>` : html`<div class="empty">No policy: NSQ's behaviour.</div>`}${counts}`;
  const extra = config.isAdmin
    ? html`<span>${button("Set Policy", "set_policy", { kind: "primary" })} ${policy ? button("Clear Policy", "clear_policy", { kind: "warning" }) : ""}</span>`
    : "";
  return card("Message policy", body, { extra, id: `${kind}-policy` });
}

function formBody(kind, subject) {
  const inputs = FIELDS[kind].map(
    (k) => html`<label class="policy-field">${k} <input name="${k}" data-policy-field="${k}" placeholder="unchanged" ${NUMBERS.has(k) ? html`inputmode="numeric"` : ""}></label><br>`,
  );
  return html`<p>Set the message policy of ${subject} on every nsqd. Empty fields stay as they are; <code>-</code> clears a field. Durations are Go's (<code>90s</code>, <code>24h</code>).</p>${inputs}`;
}

// Runs a "set_policy" or "clear_policy" button's action; true when something changed.
export async function policyAction(action, path, kind, subject) {
  if (action === "clear_policy") {
    const ok = await confirmAction({
      title: "Clear message policy",
      body: `Clear the message policy of ${subject}? Its messages are then delivered as NSQ does (nsqd flags still apply).`,
      confirmLabel: "Clear Policy",
    });
    if (!ok) return false;
    return send(path, { action });
  }
  const ok = await confirmAction({ title: "Set message policy", body: formBody(kind, subject), confirmLabel: "Set Policy" });
  if (!ok) return false;
  const policy = {};
  for (const input of document.querySelectorAll("#confirm-dialog [data-policy-field]")) {
    const value = input.value.trim();
    if (!value) continue;
    const key = input.dataset.policyField;
    policy[key] = value === "-" ? null : NUMBERS.has(key) && /^\d+$/.test(value) ? Number(value) : value;
  }
  return send(path, { action, policy });
}

async function send(path, body) {
  try {
    const result = await post(path, body);
    if (result && result.message) flash("warning", result.message);
    else flash("success", "Message policy updated.");
    return true;
  } catch (err) {
    flash("error", err.message);
    return false;
  }
}
