// Counter: the total of messages processed by every channel, animated as it grows.

import { get } from "../api.js";
import { html } from "../html.js";
import { num, rate } from "../format.js";
import { sparkline } from "../chart.js";
import { pageHeader, warningBanner } from "../ui.js";

export default {
  title: () => "Counter",
  refreshes: true,
  mount(root) {
    root.innerHTML = html`
      <div data-region="header">${pageHeader({ title: "Counter", subtitle: "Messages processed by every channel of the cluster" })}</div>
      <div data-region="warning"></div>
      <section class="counter card">
        <div class="counter-value" data-role="total">–</div>
        <div class="counter-label">messages processed</div>
        <div class="counter-rate"><span data-role="rate">–</span></div>
        <div class="counter-spark" data-role="spark"></div>
      </section>`.text;
    const totalEl = root.querySelector('[data-role="total"]');
    const rateEl = root.querySelector('[data-role="rate"]');
    const sparkEl = root.querySelector('[data-role="spark"]');
    let shown = null;
    let previous = null;
    let frame = 0;
    const rates = [];

    function animate(from, to) {
      cancelAnimationFrame(frame);
      if (from === null || from === to) {
        totalEl.textContent = num(to);
        return;
      }
      const start = performance.now();
      const duration = 900;
      const step = (now) => {
        const f = Math.min(1, (now - start) / duration);
        const eased = 1 - Math.pow(1 - f, 3);
        totalEl.textContent = num(Math.round(from + (to - from) * eased));
        if (f < 1) frame = requestAnimationFrame(step);
      };
      frame = requestAnimationFrame(step);
    }

    return {
      async refresh() {
        const doc = await get("api/counter");
        const total = Object.values(doc.stats || {}).reduce((n, s) => n + s.message_count, 0);
        const now = performance.now() / 1000;
        if (previous && now > previous.at) {
          const r = Math.max(0, (total - previous.total) / (now - previous.at));
          rates.push(r);
          if (rates.length > 60) rates.shift();
          rateEl.textContent = `${rate(r)} right now`;
          sparkEl.innerHTML = sparkline(rates, { width: 320, height: 40 }).text;
        }
        previous = { total, at: now };
        root.querySelector('[data-region="warning"]').innerHTML = warningBanner(doc.message).text;
        totalEl.dataset.value = String(total);
        animate(shown, total);
        shown = total;
      },
      dispose() {
        cancelAnimationFrame(frame);
      },
    };
  },
};
