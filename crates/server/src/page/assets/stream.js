// One stream: its figures and actions, its schema with its history, a live feed of the rows it
// commits, its rejects with their reasons, and msg/s, lag and latency over the last hour.

import { h, state, fmt, errorText, writeButton } from "/ui/app.js";
import { api, events, canWrite } from "/ui/api.js";

export async function render(main, [id]) {
  const path = `/api/streams/${encodeURIComponent(id)}`;
  const r = await api("GET", path);
  if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
  const s = r.body;
  const message = h("p", { class: "error", id: "stream-message" });
  const figures = h("div", { id: "figures" });
  const schema = h("div", { id: "schema" });
  const history = h("div", { id: "schema-history" });
  const feed = h("div", { class: "feed", id: "feed" });
  const rejects = h("div", { id: "rejects" });
  const chart = h("div", { id: "chart" });
  const lagChart = h("div", { id: "chart-lag" });
  const latencyChart = h("div", { id: "chart-latency" });
  main.append(
    h("h1", {}, `Stream ${id}`), message,
    h("div", { class: "actions" },
      s.config.source.type === "postgres"
        ? writeButton("Resnapshot", () => act("POST", `${path}/resnapshot`, "Started over from the source."), { id: "resnapshot", class: "secondary" })
        : null,
      writeButton("Edit", () => { location.hash = `#/streams/${encodeURIComponent(id)}/edit`; }, { id: "edit-stream", class: "secondary" }),
      writeButton(s.config.paused ? "Resume" : "Pause", async () => {
        const a = await api("POST", `${path}/${s.config.paused ? "resume" : "pause"}`);
        if (a.ok) window.dispatchEvent(new HashChangeEvent("hashchange")); else message.textContent = errorText(a);
      }, { id: "pause-resume", class: "secondary" }),
      writeButton("Delete", async () => {
        if (!confirm(`Delete stream ${id}? Its table stays.`)) return;
        const d = await api("DELETE", path);
        if (d.ok) location.hash = "#/pipelines"; else message.textContent = errorText(d);
      }, { id: "delete-stream", class: "danger" })),
    figures,
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Live feed"), h("p", { class: "muted" }, "Rows as they commit; at most 20 per batch."), feed),
      h("div", { class: "card" }, h("h2", {}, "msg/s, last hour"), chart)),
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Lag, last hour"), lagChart),
      h("div", { class: "card" }, h("h2", {}, "Latency ms, last hour"), latencyChart)),
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Schema"), schema, h("h2", {}, "How it evolved"), history),
      h("div", { class: "card" }, h("h2", {}, "Rejects"), rejects)),
    h("div", { class: "card" }, h("h2", {}, "Config"), h("pre", { id: "config" }, JSON.stringify(s.config, null, 2))));

  async function act(method, url, done) {
    const a = await api(method, url);
    message.textContent = a.ok ? "" : errorText(a);
    if (a.ok) figures.dataset.note = done;
  }

  async function loadFigures() {
    // The stream's own route: its metrics without counting as a metrics API check.
    const m = await api("GET", path);
    if (!m.ok) return;
    const x = m.body.metrics;
    figures.replaceChildren(h("table", {}, h("tbody", {},
      h("tr", {}, h("th", {}, "State"), h("td", {}, state(x.state), x.last_error ? ` ${x.last_error}` : ""),
        h("th", {}, "msg/s"), h("td", { class: "num" }, fmt(x.messages_per_sec)),
        h("th", {}, "Events"), h("td", { class: "num", id: "events-in" }, fmt(x.events_in, 0)),
        h("th", {}, "Rejects"), h("td", { class: "num" }, fmt(x.rejects, 0)),
        h("th", {}, "Latency p50/p99 ms"), h("td", { class: "num" }, `${fmt(x.latency_ms.p50)} / ${fmt(x.latency_ms.p99)}`),
        h("th", {}, "Lag"), h("td", { class: "num" }, `${fmt(x.lag_messages, 0)} msgs, ${fmt(x.max_lag_seconds)} s max`)))));
  }

  async function loadSchema() {
    const sc = await api("GET", `${path}/schema`);
    if (!sc.ok) { schema.textContent = errorText(sc); return; }
    const tables = Object.entries(sc.body.tables);
    schema.replaceChildren(...(tables.length ? tables : [[s.config.table, []]]).map(([table, columns]) =>
      h("div", {}, h("strong", {}, table),
        h("table", { class: "columns" }, h("tbody", {}, columns.map((c) =>
          h("tr", { "data-column": c.name }, h("td", {}, c.name), h("td", {}, c.type))))))));
    history.replaceChildren(h("table", {}, h("tbody", {}, sc.body.history.slice().reverse().map((e) =>
      h("tr", { "data-change": e.change, "data-column": e.column },
        h("td", {}, new Date(e.applied_at).toLocaleString()), h("td", {}, e.change),
        h("td", {}, e.column), h("td", {}, e.type), h("td", { class: "muted" }, `#${e.sequence}`))))));
  }

  async function loadRejects() {
    const res = await api("GET", `${path}/rejects?limit=50`);
    if (!res.ok) { rejects.textContent = errorText(res); return; }
    const body = h("tbody", {});
    for (const row of res.body.rows) {
      const detail = h("tr", { class: "detail", hidden: true },
        h("td", { colspan: 4 }, h("div", { class: "reject-reason" }, h("strong", {}, "Reason: "), row.reason),
          h("div", {}, h("strong", {}, "Value: "), h("code", {}, row.value ?? "")),
          h("div", { class: "muted" }, `table ${row.table}, expected ${row.expected_type ?? "an object"}, event #${row.position}`)));
      body.append(h("tr", { class: "clickable reject", onclick: () => { detail.hidden = !detail.hidden; } },
        h("td", {}, row.column ?? "(whole event)"), h("td", {}, row.expected_type ?? ""),
        h("td", {}, String(row.value ?? "").slice(0, 40)), h("td", {}, new Date(row.received_at).toLocaleTimeString())), detail);
    }
    rejects.replaceChildren(res.body.rows.length
      ? h("table", {}, h("thead", {}, h("tr", {}, ["Column", "Expected", "Value", "Received"].map((c) => h("th", {}, c)))), body)
      : h("p", { class: "muted" }, "No rejects."));
  }

  async function loadChart() {
    const hist = await api("GET", `${path}/metrics/history`);
    if (!hist.ok) return;
    const samples = hist.body.samples;
    const series = (name, value) => ({ name, points: samples.map((p) => [p.at_ms, value(p)]) });
    chart.replaceChildren(lineChart(samples.map((p) => [p.at_ms, p.messages_per_sec])));
    // Lag in messages where the source counts them; in seconds where it does not (Kinesis).
    const inSeconds = samples.every((p) => !p.lag_messages) && samples.some((p) => p.lag_seconds > 0);
    lagChart.replaceChildren(lineChart([inSeconds
      ? series("seconds", (p) => p.lag_seconds)
      : series("messages", (p) => p.lag_messages)]));
    latencyChart.replaceChildren(lineChart([series("p50", (p) => p.latency_p50_ms), series("p99", (p) => p.latency_p99_ms)]));
  }

  function addFeed(kind, data) {
    const line = (text) => {
      feed.prepend(h("div", { class: `event ${kind}` }, h("span", { class: "kind" }, kind), text));
      while (feed.children.length > 200) feed.lastChild.remove();
    };
    if (kind === "rows") {
      for (const row of data.rows.slice().reverse()) line(`${data.table} ${JSON.stringify(row)}`);
    } else if (kind === "schema") {
      line(`${data.table}: ${data.changes.map((c) => `${c.change} ${c.column} ${c.type}`).join(", ")}`);
      loadSchema();
    } else if (kind === "rejects") {
      line(`${data.count} rejected: ${data.sample.map((r) => r.reason).join("; ")}`);
      loadRejects();
    } else if (kind === "skipped") {
      line(`${data.skipped} events skipped (too fast to show)`);
    } else if (kind === "open") {
      feed.dataset.open = "true";
    }
  }

  const controller = new AbortController();
  events(`${path}/feed`, addFeed, controller.signal);
  await Promise.all([loadFigures(), loadSchema(), loadRejects(), loadChart()]);
  const fast = setInterval(loadFigures, 2000);
  const slow = setInterval(loadChart, 10000);
  return () => { controller.abort(); clearInterval(fast); clearInterval(slow); };
}

/** Colours of a chart's series, in order. */
const COLORS = ["#2458d6", "#d97706", "#16803c"];

/**
 * An inline SVG line chart on one scale: `[time_ms, value]` points, or several series as
 * `[{ name, points }]`, named in a legend.
 */
export function lineChart(series, width = 520, height = 160) {
  if (!series.length || Array.isArray(series[0])) series = [{ points: series }];
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", "100%");
  const text = (x, y, t, anchor = "start") => {
    const el = document.createElementNS(ns, "text");
    el.setAttribute("x", x); el.setAttribute("y", y); el.setAttribute("text-anchor", anchor); el.textContent = t;
    svg.append(el);
    return el;
  };
  if (series.every((s) => s.points.length < 2)) { text(width / 2, height / 2, "Collecting samples…", "middle"); return svg; }
  const pad = { l: 48, r: 8, t: 10, b: 22 };
  const all = series.flatMap((s) => s.points);
  const t0 = all.reduce((t, p) => Math.min(t, p[0]), Infinity), t1 = all.reduce((t, p) => Math.max(t, p[0]), -Infinity);
  const max = all.reduce((m, p) => Math.max(m, p[1]), 1);
  const x = (t) => pad.l + (t - t0) / Math.max(1, t1 - t0) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - v / max * (height - pad.t - pad.b);
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("d", `M${pad.l},${pad.t} V${height - pad.b} H${width - pad.r}`);
  axis.setAttribute("stroke", "#98a2b3"); axis.setAttribute("fill", "none");
  svg.append(axis);
  // A line per series, and its name in its colour, in a row that ends at the top right corner.
  const named = series.filter((s) => s.name);
  let legend = width - pad.r - named.reduce((w, s) => w + s.name.length * 7 + 14, -14);
  for (const [i, s] of series.entries()) {
    const color = COLORS[i % COLORS.length];
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "2");
    svg.append(line);
    if (!s.name) continue;
    line.setAttribute("data-series", s.name);
    text(legend, pad.t + 10, s.name).setAttribute("fill", color);
    legend += s.name.length * 7 + 14;
  }
  text(pad.l - 4, pad.t + 10, fmt(max), "end");
  text(pad.l - 4, height - pad.b, "0", "end");
  text(pad.l, height - 4, new Date(t0).toLocaleTimeString());
  text(width - pad.r, height - 4, new Date(t1).toLocaleTimeString(), "end");
  return svg;
}
