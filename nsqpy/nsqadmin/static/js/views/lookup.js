// Lookup: the nsqlookupd hosts, topics/channels they know that no nsqd produces, and the
// form to create a topic or channel.

import { get, post, del, enc } from "../api.js";
import { html } from "../html.js";
import { config, pageHeader, card, empty, warningBanner, flash, runAction } from "../ui.js";

const NAME = "^[\\.a-zA-Z0-9_\\-]+(#ephemeral)?$";

export default {
  title: () => "Lookup",
  refreshes: true,
  mount(root, _params, ctx) {
    const lookupds = config.nsqlookupd;
    const createForm = config.isAdmin
      ? card(
          "Create topic / channel",
          html`<form class="form-inline" data-role="create" autocomplete="off">
            <label><span>Topic</span><input class="input" name="topic" required maxlength="64" pattern="${NAME}" placeholder="topic name"></label>
            <label><span>Channel <span class="muted">(optional)</span></span><input class="input" name="channel" maxlength="64" pattern="${NAME}" placeholder="channel name"></label>
            <button class="btn btn-primary" type="submit">Create</button>
          </form>
          <p class="help">${lookupds.length
            ? "The topic is created on every nsqlookupd; a channel is also created on every nsqd that already produces the topic."
            : "The topic (and channel) is created on every nsqd given with --nsqd-http-address."}</p>`,
          { id: "create" },
        )
      : "";
    root.innerHTML = html`
      ${pageHeader({ title: "Lookup", subtitle: lookupds.length ? `${lookupds.length} nsqlookupd` : "nsqadmin talks to nsqd directly" })}
      <div data-region="warning"></div>
      <div class="grid-2">
        ${card(
          "nsqlookupd hosts",
          lookupds.length
            ? html`<ul class="list">${lookupds.map((a) => html`<li class="mono">${a}</li>`)}</ul>`
            : empty("None: nsqadmin was started with --nsqd-http-address."),
        )}
        ${createForm}
      </div>
      ${lookupds.length
        ? card("Inactive topics and channels", html`<p class="help">Registered with nsqlookupd but produced by no nsqd.</p><div data-region="inactive"></div>`, { id: "inactive" })
        : ""}`.text;

    const form = root.querySelector('[data-role="create"]');
    if (form) {
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const topic = form.topic.value.trim();
        const channel = form.channel.value.trim();
        try {
          const result = await post("api/topics", channel ? { topic, channel } : { topic });
          if (result && result.message) flash("warning", result.message);
          else flash("success", channel ? `Created ${topic}/${channel}.` : `Created topic ${topic}.`);
          form.reset();
          await ctx.refreshNow();
        } catch (err) {
          flash("error", err.message);
        }
      });
    }
    root.addEventListener("click", async (event) => {
      const btn = event.target.closest("button[data-action]");
      if (!btn) return;
      const { topic, channel } = btn.dataset;
      const ok = await runAction({
        title: channel ? "Delete channel" : "Delete topic",
        body: channel
          ? html`Delete channel <strong>${topic}/${channel}</strong> from every nsqlookupd?`.text
          : html`Delete topic <strong>${topic}</strong> and its channels from every nsqlookupd?`.text,
        confirmLabel: "Delete",
        call: () => del(channel ? `api/topics/${enc(topic)}/${enc(channel)}` : `api/topics/${enc(topic)}`),
        done: channel ? `Deleted ${topic}/${channel}.` : `Deleted topic ${topic}.`,
      });
      if (ok) await ctx.refreshNow();
    });

    return {
      async refresh() {
        if (!lookupds.length) return;
        const doc = await get("api/topics?inactive=true");
        const topics = doc.topics || {};
        const names = Object.keys(topics).sort();
        root.querySelector('[data-region="warning"]').innerHTML = warningBanner(doc.message).text;
        const region = root.querySelector('[data-region="inactive"]');
        region.innerHTML = (names.length
          ? html`<ul class="tree">${names.map(
              (t) => html`<li data-topic="${t}">
                <div class="tree-row"><a href="topics/${enc(t)}" data-link class="mono">${t}</a>
                  ${config.isAdmin ? html`<button type="button" class="btn btn-sm btn-ghost" data-action="delete" data-topic="${t}">Delete</button>` : ""}</div>
                ${(topics[t] || []).length
                  ? html`<ul>${topics[t].map(
                      (c) => html`<li data-channel="${c}"><div class="tree-row"><span class="mono">${c}</span>
                        ${config.isAdmin ? html`<button type="button" class="btn btn-sm btn-ghost" data-action="delete" data-topic="${t}" data-channel="${c}">Delete</button>` : ""}</div></li>`,
                    )}</ul>`
                  : ""}
              </li>`,
            )}</ul>`
          : empty("None: every topic known to nsqlookupd is produced by some nsqd.")
        ).text;
      },
    };
  },
};
