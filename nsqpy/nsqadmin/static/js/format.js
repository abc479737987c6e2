// Number, rate and duration formatting.

const INTEGER = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

export function num(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return INTEGER.format(value);
}

// 1234 → "1.2k", 5600000 → "5.6M"
export function compact(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  const units = [
    [1e12, "T"],
    [1e9, "G"],
    [1e6, "M"],
    [1e3, "k"],
  ];
  for (const [size, suffix] of units) {
    if (abs >= size) {
      const scaled = value / size;
      return `${scaled >= 100 ? scaled.toFixed(0) : scaled.toFixed(1).replace(/\.0$/, "")}${suffix}`;
    }
  }
  if (abs > 0 && abs < 10 && !Number.isInteger(value)) return value.toFixed(abs < 1 ? 2 : 1);
  return INTEGER.format(value);
}

export function rate(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value === 0) return "0/s";
  if (value < 10) return `${value.toFixed(2)}/s`;
  if (value < 1000) return `${value.toFixed(1)}/s`;
  return `${compact(value)}/s`;
}

// nanoseconds → "850µs", "12.3ms", "1.24s"
export function nanos(ns) {
  if (ns === null || ns === undefined || Number.isNaN(ns)) return "–";
  if (ns < 1e3) return `${Math.round(ns)}ns`;
  if (ns < 1e6) return `${(ns / 1e3).toFixed(ns < 1e4 ? 1 : 0)}µs`;
  if (ns < 1e9) return `${(ns / 1e6).toFixed(ns < 1e7 ? 2 : 1)}ms`;
  return seconds(ns / 1e9);
}

// seconds → "42s", "5m13s", "2h58m", "3d4h" (Go-like, trimmed)
export function seconds(total) {
  if (total === null || total === undefined || Number.isNaN(total)) return "–";
  if (total < 10 && total % 1 !== 0) return `${total.toFixed(2)}s`;
  let s = Math.floor(total);
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (d) return `${d}d${h}h`;
  if (h) return `${h}h${m}m`;
  if (m) return `${m}m${s}s`;
  return `${s}s`;
}

export function ago(unixSeconds) {
  if (!unixSeconds) return "never";
  const delta = Math.max(0, Date.now() / 1000 - unixSeconds);
  if (delta < 1.5) return "just now";
  return `${seconds(Math.round(delta))} ago`;
}

export function clock(unixSeconds) {
  const d = new Date(unixSeconds * 1000);
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function quantileLabel(q) {
  const pct = q * 100;
  return `p${Number.isInteger(pct) ? pct : pct.toFixed(1)}`;
}
