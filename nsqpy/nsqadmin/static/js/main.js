// nsqadmin single-page app: router, auto-refresh and the page header.

import { config } from "./ui.js";
import { attachChartHover, redrawHover } from "./chart.js";
import { errorState } from "./ui.js";
import { actionRunning, leavePage } from "./api.js";
import streams from "./views/streams.js";
import topic from "./views/topic.js";
import channel from "./views/channel.js";
import nodes from "./views/nodes.js";
import node from "./views/node.js";
import counter from "./views/counter.js";
import lookup from "./views/lookup.js";

const ROUTES = [
  [/^$/, streams, "streams"],
  [/^topics\/?$/, streams, "streams"],
  [/^topics\/([^/]+)\/?$/, topic, "streams"],
  [/^topics\/([^/]+)\/([^/]+)\/?$/, channel, "streams"],
  [/^nodes\/?$/, nodes, "nodes"],
  [/^nodes\/([^/]+)\/?$/, node, "nodes"],
  [/^counter\/?$/, counter, "counter"],
  [/^lookup\/?$/, lookup, "lookup"],
];

const app = document.getElementById("app");
// A page whose first load failed shows why here, its view hidden but kept: the next
// refresh that succeeds shows the view again (a transient upstream error must not leave
// the page broken until a reload).
const pageError = document.createElement("div");
pageError.className = "page";
pageError.hidden = true;
app.before(pageError);

function showPageError(err) {
  pageError.innerHTML = errorState(err).text;
  pageError.hidden = false;
  app.hidden = true;
}

function hidePageError() {
  pageError.hidden = true;
  pageError.innerHTML = "";
  app.hidden = false;
}

const base = new URL(document.baseURI).pathname;
// Refresh about as often as the cluster is sampled (1–10 s).
const refreshMs = Math.min(10, Math.max(1, config.sampleInterval || 5)) * 1000;

let current = null;
let timer = null;
let live = true;

function relativePath() {
  let path = location.pathname;
  if (path.startsWith(base)) path = path.slice(base.length);
  else if (path + "/" === base) path = "";
  return path.replace(/^\/+/, "");
}

function match(path) {
  for (const [re, view, nav] of ROUTES) {
    const m = re.exec(path);
    if (m) return { view, nav, params: m.slice(1).map(decodeURIComponent) };
  }
  return null;
}

async function refresh() {
  if (!current || actionRunning()) return;
  const mine = current;
  try {
    await mine.controller.refresh();
    if (mine === current) mine.failed = false;
  } catch (err) {
    if (mine !== current || err.aborted) return;
    if (!mine.loaded) showPageError(err);
    mine.failed = true;
    console.warn("refresh failed", err);
    document.body.classList.add("stale");
    return;
  }
  if (mine === current) {
    if (!mine.loaded) hidePageError();
    mine.loaded = true;
    document.body.classList.remove("stale");
    redrawHover(app);
    pulse();
  }
}

function pulse() {
  const dot = document.querySelector(".live-dot");
  dot.classList.remove("pulse");
  void dot.offsetWidth;
  dot.classList.add("pulse");
}

function schedule() {
  clearTimeout(timer);
  if (!live || !current || !current.view.refreshes) return;
  timer = setTimeout(async () => {
    if (!document.hidden) await refresh();
    schedule();
  }, current.view.interval || refreshMs);
}

export async function navigate() {
  const path = relativePath();
  const found = match(path);
  if (current && current.controller.dispose) current.controller.dispose();
  leavePage();
  clearTimeout(timer);
  hidePageError();
  document.querySelectorAll("[data-nav]").forEach((a) => {
    a.classList.toggle("active", found && a.dataset.nav === found.nav);
  });
  if (!found) {
    current = null;
    app.innerHTML = '<div class="banner banner-error">Page not found.</div>';
    document.title = "nsqadmin";
    return;
  }
  // Each page gets an element of its own: a refresh of the page before, still in flight
  // (say the topic just deleted, answering TOPIC_NOT_FOUND), writes into its own element,
  // now detached, instead of over this page.
  const root = document.createElement("div");
  root.innerHTML = '<div class="loading">Loading…</div>';
  app.replaceChildren(root);
  const controller = found.view.mount(root, found.params, { refreshNow: () => refresh() });
  current = { view: found.view, controller, loaded: false };
  document.title = `${found.view.title(found.params)} · nsqadmin`;
  await refresh();
  schedule();
}

function go(href) {
  const url = new URL(href, document.baseURI);
  if (url.origin !== location.origin) {
    location.href = url.href;
    return;
  }
  history.pushState(null, "", url.pathname + url.search);
  window.scrollTo(0, 0);
  navigate();
}

document.addEventListener("click", (event) => {
  const a = event.target.closest && event.target.closest("a[data-link]");
  if (!a || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  go(a.getAttribute("href"));
});
window.addEventListener("popstate", navigate);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && live) refresh();
});

const liveToggle = document.getElementById("live-toggle");
liveToggle.addEventListener("click", () => {
  live = !live;
  liveToggle.setAttribute("aria-pressed", String(live));
  liveToggle.querySelector(".live-label").textContent = live ? "Live" : "Paused";
  document.body.classList.toggle("paused-refresh", !live);
  if (live) refresh().then(schedule);
  else clearTimeout(timer);
});

document.getElementById("version").textContent = `v${config.version}`;
if (config.aclEnabled) {
  const badge = document.getElementById("user-badge");
  badge.hidden = false;
  badge.textContent = config.isAdmin ? config.user || "admin" : config.user ? `${config.user} · read-only` : "read-only";
  badge.classList.toggle("read-only", !config.isAdmin);
}
document.body.classList.toggle("is-admin", config.isAdmin);
attachChartHover(app);
window.nsqadmin = { navigate: go, refresh };
navigate();
