// Line charts and sparklines as inline SVG, from nsqadmin's sampled history.
//
// The plot is an SVG stretched to its box (preserveAspectRatio="none") with strokes that
// do not scale, so lines stay crisp at any width; all text is HTML around it.

import { html, raw, escape } from "./html.js";
import { compact, clock, rate } from "./format.js";

const FORMATS = { count: compact, rate };

const W = 1000;
const H = 200;
const TOP = 10;
export const COLORS = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2"];

function niceMax(value) {
  if (!(value > 0)) return 1;
  const exp = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) {
    if (step * exp >= value) return step * exp;
  }
  return 10 * exp;
}

function xScale(timestamps) {
  const t0 = timestamps[0];
  const t1 = timestamps[timestamps.length - 1];
  const span = t1 - t0;
  return (t) => (span > 0 ? ((t - t0) / span) * W : W / 2);
}

// Path segments, broken where a value is missing.
function linePaths(timestamps, values, x, y) {
  const segments = [];
  let current = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) {
      if (current.length) segments.push(current);
      current = [];
    } else {
      current.push([x(timestamps[i]), y(v)]);
    }
  });
  if (current.length) segments.push(current);
  const line = segments
    .map((pts) => {
      const f = (n) => n.toFixed(1);
      if (pts.length === 1) return `M${f(pts[0][0])},${f(pts[0][1])}h0.01`;
      return pts.map(([px, py], i) => `${i ? "L" : "M"}${f(px)},${f(py)}`).join("");
    })
    .join("");
  const area = segments
    .filter((pts) => pts.length > 1)
    .map((pts) => {
      const f = (n) => n.toFixed(1);
      const body = pts.map(([px, py], i) => `${i ? "L" : "M"}${f(px)},${f(py)}`).join("");
      return `${body}L${f(pts[pts.length - 1][0])},${H}L${f(pts[0][0])},${H}Z`;
    })
    .join("");
  return { line, area };
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) {
    if (values[i] !== null && values[i] !== undefined) return values[i];
  }
  return null;
}

// chart({title, timestamps, series: [{label, values, color}], kind: "count"|"rate"}) → figure
export function chart({ title, timestamps = [], series = [], kind = "count", note = "" }) {
  const format = FORMATS[kind] || compact;
  const all = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const colored = series.map((s, i) => ({ ...s, color: s.color || COLORS[i % COLORS.length] }));
  const current = colored.length === 1 ? lastValue(colored[0].values) : null;
  const legend =
    colored.length > 1
      ? html`<span class="chart-legend">${colored.map(
          (s) => html`<span><i style="background:${s.color}"></i>${s.label} <b>${format(lastValue(s.values))}</b></span>`,
        )}</span>`
      : html`<span class="chart-value">${current === null ? "–" : format(current)}</span>`;
  if (!timestamps.length || !all.length) {
    return html`<figure class="chart chart-empty">
      <figcaption><span class="chart-title">${title}</span>${legend}</figcaption>
      <div class="chart-plot"><span class="chart-wait">${note || "Collecting samples…"}</span></div>
    </figure>`;
  }
  const max = niceMax(Math.max(...all, 0) * 1.15);
  const x = xScale(timestamps);
  const y = (v) => H - (v / max) * (H - TOP);
  const paths = colored.map((s) => ({ ...linePaths(timestamps, s.values, x, y), color: s.color }));
  const data = JSON.stringify({
    t: timestamps,
    s: colored.map((s) => ({ l: s.label, v: s.values, c: s.color })),
  });
  const grid = [0.25, 0.5, 0.75].map((f) => {
    const gy = (H - (H - TOP) * f).toFixed(1);
    return raw(`<line class="grid" x1="0" x2="${W}" y1="${gy}" y2="${gy}" vector-effect="non-scaling-stroke"/>`);
  });
  return html`<figure class="chart" data-chart="${data}" data-kind="${kind}">
    <figcaption><span class="chart-title">${title}</span>${legend}</figcaption>
    <div class="chart-plot">
      <span class="chart-ymax">${format(max)}</span>
      <svg class="chart-svg" viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="${title}">
        ${grid}
        <line class="baseline" x1="0" x2="${W}" y1="${H}" y2="${H}" vector-effect="non-scaling-stroke"/>
        ${paths.map((p) => (p.area ? raw(`<path class="area" d="${p.area}" fill="${escape(p.color)}"/>`) : ""))}
        ${paths.map((p) => raw(`<path class="line" d="${p.line}" stroke="${escape(p.color)}" vector-effect="non-scaling-stroke"/>`))}
      </svg>
      <div class="chart-cursor" hidden></div>
      <div class="chart-tip" hidden></div>
    </div>
    <div class="chart-axis"><span>${clock(timestamps[0])}</span><span>${clock(timestamps[timestamps.length - 1])}</span></div>
  </figure>`;
}

// A tiny trend line for table cells.
export function sparkline(values, { width = 96, height = 24, color = COLORS[0] } = {}) {
  const present = values.filter((v) => v !== null && v !== undefined);
  if (present.length < 2) return html`<span class="spark-empty"></span>`;
  const max = Math.max(...present, 0) || 1;
  const step = width / Math.max(values.length - 1, 1);
  let d = "";
  let pen = false;
  values.forEach((v, i) => {
    if (v === null || v === undefined) {
      pen = false;
      return;
    }
    const px = (i * step).toFixed(1);
    const py = (height - 2 - (v / max) * (height - 4)).toFixed(1);
    d += `${pen ? "L" : "M"}${px},${py}`;
    pen = true;
  });
  return raw(
    `<svg class="spark" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" aria-hidden="true"><path d="${d}" stroke="${escape(color)}"/></svg>`,
  );
}

// Hover read-out for every chart under root (one delegated listener). Pages re-render on
// every refresh, so the pointer's position is remembered and the read-out redrawn after.
let hover = null;

function showTip(plot, clientX) {
  const figure = plot.closest(".chart");
  if (!figure || !figure.dataset.chart) return;
  const data = JSON.parse(figure.dataset.chart);
  const fmt = FORMATS[figure.dataset.kind] || compact;
  const box = plot.getBoundingClientRect();
  const frac = Math.min(1, Math.max(0, (clientX - box.left) / box.width));
  const t0 = data.t[0];
  const t1 = data.t[data.t.length - 1];
  const target = t0 + frac * (t1 - t0);
  let best = 0;
  data.t.forEach((t, i) => {
    if (Math.abs(t - target) < Math.abs(data.t[best] - target)) best = i;
  });
  const px = t1 > t0 ? ((data.t[best] - t0) / (t1 - t0)) * box.width : box.width / 2;
  const cursor = plot.querySelector(".chart-cursor");
  const tip = plot.querySelector(".chart-tip");
  cursor.hidden = false;
  cursor.style.left = `${px}px`;
  tip.hidden = false;
  tip.innerHTML = html`<b>${clock(data.t[best])}</b>${data.s.map(
    (ser) => html`<span><i style="background:${ser.c}"></i>${ser.l}: ${fmt(ser.v[best])}</span>`,
  )}`.text;
  const left = px > box.width / 2 ? px - tip.offsetWidth - 10 : px + 10;
  tip.style.left = `${left}px`;
}

export function attachChartHover(root) {
  document.addEventListener("mousemove", (event) => {
    const plot = event.target.closest && event.target.closest(".chart-plot");
    if (!plot || !root.contains(plot)) {
      hover = null;
      return;
    }
    const plots = [...root.querySelectorAll(".chart-plot")];
    hover = { index: plots.indexOf(plot), clientX: event.clientX };
    showTip(plot, event.clientX);
  });
  root.addEventListener(
    "mouseleave",
    (event) => {
      if (!event.target.classList || !event.target.classList.contains("chart-plot")) return;
      hover = null;
      event.target.querySelectorAll(".chart-cursor, .chart-tip").forEach((el) => (el.hidden = true));
    },
    true,
  );
}

export function redrawHover(root) {
  if (!hover) return;
  const plot = root.querySelectorAll(".chart-plot")[hover.index];
  if (plot) showTip(plot, hover.clientX);
  else hover = null;
}
