// Shared page pieces: confirmation dialog, flash messages, headers, tiles, tables.

import { duringAction } from "./api.js";
import { html } from "./html.js";
import { num } from "./format.js";

export const config = JSON.parse(document.getElementById("nsqadmin-config").textContent);

// -- confirmation -----------------------------------------------------------------------

export function confirmAction({ title, body, confirmLabel = "Confirm", danger = true }) {
  const dialog = document.getElementById("confirm-dialog");
  dialog.querySelector(".dialog-title").textContent = title;
  dialog.querySelector(".dialog-body").innerHTML = body instanceof Object ? body.text : body;
  const ok = dialog.querySelector('[data-role="confirm"]');
  ok.textContent = confirmLabel;
  ok.className = `btn ${danger ? "btn-danger" : "btn-primary"}`;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    dialog.querySelector('[data-role="cancel"]').focus();
  });
}

// -- flash messages -----------------------------------------------------------------------

export function flash(kind, text, { timeout } = {}) {
  const area = document.getElementById("flash");
  const item = document.createElement("div");
  item.className = `flash flash-${kind}`;
  item.setAttribute("role", kind === "error" ? "alert" : "status");
  item.innerHTML = html`<span class="flash-text">${text}</span><button type="button" class="flash-close" aria-label="Dismiss">×</button>`.text;
  item.querySelector(".flash-close").addEventListener("click", () => item.remove());
  area.append(item);
  while (area.children.length > 3) area.firstElementChild.remove();
  const ms = timeout ?? (kind === "success" ? 5000 : 0);
  if (ms) setTimeout(() => item.remove(), ms);
  return item;
}

// Run an admin action: confirm, call, report; resolves true when it was done.
export async function runAction({ title, body, confirmLabel, danger = true, call, done }) {
  if (!(await confirmAction({ title, body, confirmLabel, danger }))) return false;
  try {
    const result = await duringAction(call);
    if (result && result.message) flash("warning", result.message);
    else flash("success", done);
    return true;
  } catch (err) {
    flash("error", err.message);
    return false;
  }
}

// -- page pieces ---------------------------------------------------------------------------

export function crumbs(items) {
  return html`<nav class="crumbs" aria-label="Breadcrumb">${items.map((item, i) =>
    i < items.length - 1
      ? html`<a href="${item.href}" data-link>${item.label}</a><span class="crumb-sep">/</span>`
      : html`<span aria-current="page">${item.label}</span>`,
  )}</nav>`;
}

export function pageHeader({ title, subtitle = "", badges = [], actions = "" }) {
  return html`<div class="page-header">
    <div class="page-title-block">
      <h1 class="page-title">${title}${badges.length ? html` <span class="badges">${badges}</span>` : ""}</h1>
      ${subtitle ? html`<p class="page-subtitle">${subtitle}</p>` : ""}
    </div>
    ${actions ? html`<div class="page-actions">${actions}</div>` : ""}
  </div>`;
}

export function badge(text, kind = "neutral", title = "") {
  return html`<span class="badge badge-${kind}" title="${title}">${text}</span>`;
}

export function tiles(items) {
  return html`<div class="tiles">${items.map(
    (t) => html`<div class="tile${t.kind ? ` tile-${t.kind}` : ""}" data-tile="${t.id || t.label}">
      <div class="tile-label">${t.label}</div>
      <div class="tile-value">${t.value}</div>
      ${t.hint ? html`<div class="tile-hint">${t.hint}</div>` : ""}
    </div>`,
  )}</div>`;
}

export function card(title, body, { extra = "", id = "" } = {}) {
  return html`<section class="card"${id ? html` id="${id}"` : ""}>
    <div class="card-header"><h2>${title}</h2>${extra}</div>
    ${body}
  </section>`;
}

export function empty(text) {
  return html`<div class="empty">${text}</div>`;
}

export function warningBanner(message) {
  return message ? html`<div class="banner banner-warning" role="status">${message}</div>` : html``;
}

export function errorState(err) {
  return html`<div class="banner banner-error" role="alert"><strong>Could not load this page.</strong> ${err.message}</div>`;
}

// "memory + disk" cell: total with its split.
export function depthSplit(memory, backend) {
  return html`<span class="split">${num(memory)} <span class="muted">+</span> ${num(backend)}</span>`;
}

export function isAdmin() {
  return config.isAdmin;
}

export function button(label, action, { kind = "", data = {} } = {}) {
  const attrs = Object.entries(data).map(([k, v]) => html` data-${k}="${v}"`);
  return html`<button type="button" class="btn${kind ? ` btn-${kind}` : ""}" data-action="${action}"${attrs}>${label}</button>`;
}
