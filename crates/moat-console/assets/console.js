// moat console: the live charts of the overview. Plain JavaScript, no library; served
// as a file (the Content-Security-Policy allows no inline script).
"use strict";

(function () {
  const lines = document.querySelectorAll("svg.live");
  if (lines.length === 0) return;
  const POINTS = 60;      // two minutes at one sample every 2 s
  const PERIOD_MS = 2000;
  const series = {};      // name -> rates, oldest first
  let last = null;

  function draw(svg, values) {
    const max = Math.max(1, ...values);
    // The samples so far span the whole width (the window fills up, then slides).
    const step = 400 / Math.max(1, values.length - 1);
    const pts = values.map((v, i) =>
      (i * step).toFixed(1) + "," + (95 - (v / max) * 80).toFixed(1));
    svg.querySelector("polyline").setAttribute("points", pts.join(" "));
    svg.querySelector("text.max").textContent = "max " + max.toFixed(1) + "/s";
  }

  async function tick() {
    try {
      const r = await fetch("/console/api/stats", { credentials: "same-origin" });
      if (!r.ok) return;
      const s = await r.json();
      if (last !== null && s.t > last.t) {
        const dt = (s.t - last.t) / 1000;
        const rates = {
          requests: Math.max(0, s.requests - last.requests) / dt,
          blocked: Math.max(0, s.blocked - last.blocked) / dt,
        };
        for (const [name, v] of Object.entries(rates)) {
          const a = (series[name] = series[name] || []);
          a.push(v);
          if (a.length > POINTS) a.shift();
        }
        document.getElementById("rps").textContent = rates.requests.toFixed(1);
        document.getElementById("bps").textContent = rates.blocked.toFixed(1);
        lines.forEach((svg) => draw(svg, series[svg.dataset.series] || []));
      }
      last = s;
    } catch (_) {
      // The gateway restarting: try again at the next tick.
    }
  }

  tick();
  setInterval(tick, PERIOD_MS);
})();
