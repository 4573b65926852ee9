// One stream: its figures and actions, its schema with its history, a live feed of the rows it
// commits, its rejects with their reasons, and msg/s over the last hour.

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
  main.append(
    h("h1", {}, `Stream ${id}`), message,
    h("div", { class: "actions" },
      s.config.source.type === "postgres"
        ? writeButton("Resnapshot", () => act("POST", `${path}/resnapshot`, "Started over from the source."), { id: "resnapshot", class: "secondary" })
        : null,
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
      h("div", { class: "card" }, h("h2", {}, "Schema"), schema, h("h2", {}, "How it evolved"), history),
      h("div", { class: "card" }, h("h2", {}, "Rejects"), rejects)),
    h("div", { class: "card" }, h("h2", {}, "Config"), h("pre", { id: "config" }, JSON.stringify(s.config, null, 2))));

  async function act(method, url, done) {
    const a = await api(method, url);
    message.textContent = a.ok ? "" : errorText(a);
    if (a.ok) figures.dataset.note = done;
  }

  async function loadFigures() {
    const m = await api("GET", `${path}/metrics`);
    if (!m.ok) return;
    const x = m.body;
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
    if (hist.ok) chart.replaceChildren(lineChart(hist.body.samples.map((p) => [p.at_ms, p.messages_per_sec])));
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

/** An inline SVG line chart of `[time_ms, value]` points. */
export function lineChart(points, width = 520, height = 160) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", "100%");
  const text = (x, y, t, anchor = "start") => {
    const el = document.createElementNS(ns, "text");
    el.setAttribute("x", x); el.setAttribute("y", y); el.setAttribute("text-anchor", anchor); el.textContent = t;
    svg.append(el);
  };
  if (points.length < 2) { text(width / 2, height / 2, "Collecting samples…", "middle"); return svg; }
  const pad = { l: 48, r: 8, t: 10, b: 22 };
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const max = Math.max(1, ...points.map((p) => p[1]));
  const x = (t) => pad.l + (t - t0) / Math.max(1, t1 - t0) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - v / max * (height - pad.t - pad.b);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
  line.setAttribute("fill", "none"); line.setAttribute("stroke", "#2458d6"); line.setAttribute("stroke-width", "2");
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("d", `M${pad.l},${pad.t} V${height - pad.b} H${width - pad.r}`);
  axis.setAttribute("stroke", "#98a2b3"); axis.setAttribute("fill", "none");
  svg.append(axis, line);
  text(pad.l - 4, pad.t + 10, fmt(max), "end");
  text(pad.l - 4, height - pad.b, "0", "end");
  text(pad.l, height - 4, new Date(t0).toLocaleTimeString());
  text(width - pad.r, height - 4, new Date(t1).toLocaleTimeString(), "end");
  return svg;
}
