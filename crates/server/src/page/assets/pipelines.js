// Pipelines: every stream and sync with its state and figures, refreshed every 2 s, and the
// server's activity as it happens.

import { h, state, fmt, errorText } from "/ui/app.js";
import { api, events } from "/ui/api.js";

export async function render(main) {
  const streamsBody = h("tbody", { id: "streams-body" });
  const syncsBody = h("tbody", { id: "syncs-body" });
  const activityList = h("ul", { id: "activity-list" });
  const error = h("p", { class: "error" });
  main.append(
    h("div", { class: "row" },
      h("div", { style: "flex: 3" },
        h("h1", {}, "Pipelines"), error,
        h("h2", {}, "Streams"),
        h("table", { id: "streams" },
          h("thead", {}, h("tr", {}, ["Stream", "Source", "Table", "State", "msg/s", "Lag", "Rows", "Rejects", "Last event"]
            .map((c, i) => h("th", { class: i >= 4 && i <= 7 ? "num" : null }, c)))),
          streamsBody),
        h("h2", {}, "Syncs"),
        h("table", { id: "syncs" },
          h("thead", {}, h("tr", {}, ["Sync", "Mode", "Destination", "Schedule", "Last run", "Rows sent", "Finished"].map((c) => h("th", {}, c)))),
          syncsBody)),
      h("div", { class: "card activity", style: "flex: 1" }, h("h2", {}, "Activity"), activityList)));

  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const [streams, syncs] = await Promise.all([api("GET", "/api/streams"), api("GET", "/api/syncs")]);
      if (!streams.ok) { error.textContent = errorText(streams); return; }
      error.textContent = "";
      streamsBody.replaceChildren(...streams.body.streams.map(streamRow));
      if (!streams.body.streams.length) streamsBody.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No streams yet.")));
      if (syncs.ok) {
        const runs = await Promise.all(syncs.body.syncs.map((s) => api("GET", `/api/syncs/${encodeURIComponent(s.id)}/runs`)));
        syncsBody.replaceChildren(...syncs.body.syncs.map((s, i) => syncRow(s, runs[i].ok ? runs[i].body.runs[0] : null)));
        if (!syncs.body.syncs.length) syncsBody.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No syncs yet.")));
      }
      if (!main.dataset.loaded) performance.mark("pipelines-loaded");
      main.dataset.loaded = "true";
    } finally {
      busy = false;
    }
  }

  const controller = new AbortController();
  const recent = await api("GET", "/api/activity?recent");
  if (recent.ok) for (const e of recent.body.events) activityList.prepend(activityItem(e));
  events("/api/activity", (kind, data) => {
    if (kind === "open" || kind === "skipped" || !data.kind) return;
    activityList.prepend(activityItem(data));
    while (activityList.children.length > 200) activityList.lastChild.remove();
  }, controller.signal);

  await refresh();
  const timer = setInterval(refresh, 2000);
  return () => { clearInterval(timer); controller.abort(); };
}

function streamRow(s) {
  const m = s.metrics;
  const lag = m.lag_messages ? `${fmt(m.lag_messages, 0)} msgs` : (m.max_lag_seconds ? `${fmt(m.max_lag_seconds)} s` : "0");
  return h("tr", { "data-stream": s.id },
    h("td", {}, h("a", { href: `#/streams/${encodeURIComponent(s.id)}` }, s.id)),
    h("td", {}, s.config.source.type),
    h("td", {}, s.config.destination ? `${s.config.table} → ${s.config.destination.kind}` : s.config.table),
    h("td", {}, state(m.state), m.last_error ? h("div", { class: "error" }, m.last_error) : null),
    h("td", { class: "num" }, fmt(m.messages_per_sec)),
    h("td", { class: "num" }, lag),
    h("td", { class: "num" }, fmt(m.rows_written, 0)),
    h("td", { class: "num" }, fmt(m.rejects, 0)),
    h("td", {}, m.last_event_time ? new Date(m.last_event_time).toLocaleString() : ""));
}

function syncRow(s, run) {
  const d = s.config.destination;
  return h("tr", { "data-sync": s.id },
    h("td", {}, h("a", { href: `#/syncs/${encodeURIComponent(s.id)}` }, s.id)),
    h("td", {}, s.config.mode),
    h("td", {}, `${d.kind} ${d.path || d.location || d.url || d.host || ""} ${d.table || d.name || ""}`),
    h("td", {}, s.config.schedule ? s.config.schedule.cron : "by hand"),
    h("td", {}, run ? state(run.status) : h("span", { class: "muted" }, "never")),
    h("td", { class: "num" }, run ? fmt(run.rows_sent, 0) : ""),
    h("td", {}, run && run.finished_at ? new Date(run.finished_at).toLocaleString() : ""));
}

export function activityItem(e) {
  return h("li", { "data-kind": e.kind },
    h("span", { class: "muted" }, new Date(e.at).toLocaleTimeString(), " "),
    h("strong", {}, e.subject), " ", h("span", { class: "state" }, e.kind.replace("_", " ")), " ", e.message);
}
