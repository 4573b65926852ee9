// Syncs: the list, a new sync (from "Send results to…" or blank), and one sync's runs, preview,
// run now, approvals and removal.

import { h, state, fmt, errorText, writeButton } from "/ui/app.js";
import { api } from "/ui/api.js";
import { schemaForm } from "/ui/form.js";

export async function render(main, [id]) {
  if (id === "new") return newSync(main);
  if (id) return oneSync(main, id);
  const r = await api("GET", "/api/syncs");
  if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
  main.append(h("h1", {}, "Syncs"),
    h("div", { class: "actions" }, writeButton("New sync", () => { sessionStorage.removeItem("sluice.sync-sql"); location.hash = "#/syncs/new"; })),
    h("table", {}, h("thead", {}, h("tr", {}, ["Sync", "Mode", "Query", "Destination", "Next run"].map((c) => h("th", {}, c)))),
      h("tbody", {}, r.body.syncs.map((s) => h("tr", {},
        h("td", {}, h("a", { href: `#/syncs/${encodeURIComponent(s.id)}` }, s.id)),
        h("td", {}, s.config.mode), h("td", {}, h("code", {}, s.config.query)),
        h("td", {}, s.config.destination.kind), h("td", {}, s.next_run_at ? new Date(s.next_run_at).toLocaleString() : "by hand"))))));
}

/** A new sync, from a form generated from the sync config's JSON Schema. */
async function newSync(main) {
  const schema = await api("GET", "/api/schema/sync");
  if (!schema.ok) { main.append(h("p", { class: "error" }, errorText(schema))); return; }
  const form = schemaForm(schema.body, {
    query: sessionStorage.getItem("sluice.sync-sql") || "", mode: "replace", destination: { kind: "sqlite" },
  });
  const result = h("div", { id: "sync-result" });
  const element = h("form", { id: "new-sync", class: "card" },
    h("h1", {}, "New sync"),
    h("p", { class: "muted" }, "Fields left empty take their defaults."),
    form.element,
    writeButton("Create sync", null, { type: "submit", id: "create-sync" }));
  element.addEventListener("submit", async (e) => {
    e.preventDefault();
    let config;
    try { config = form.value(); } catch (err) { result.replaceChildren(h("p", { class: "error" }, err.message)); return; }
    const r = await api("POST", "/api/syncs", config);
    if (!r.ok) { result.replaceChildren(h("p", { class: "error", id: "sync-error" }, errorText(r))); return; }
    sessionStorage.removeItem("sluice.sync-sql");
    location.hash = `#/syncs/${encodeURIComponent(r.body.id)}`;
  });
  main.append(element, result);
}

async function oneSync(main, id) {
  const path = `/api/syncs/${encodeURIComponent(id)}`;
  const r = await api("GET", path);
  if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
  const message = h("p", { id: "sync-message", class: "muted" });
  const runs = h("div", { id: "runs" });
  const preview = h("div", { id: "preview" });
  const loadRuns = async () => {
    const rr = await api("GET", `${path}/runs`);
    if (!rr.ok) { runs.textContent = errorText(rr); return; }
    runs.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["Run", "Trigger", "Status", "Started", "ms", "Sent", "Ins", "Upd", "Del", "Error", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, rr.body.runs.map((run) => h("tr", { "data-run": run.id, "data-status": run.status },
        h("td", {}, run.id), h("td", {}, run.trigger), h("td", {}, state(run.status)),
        h("td", {}, new Date(run.started_at).toLocaleString()), h("td", { class: "num" }, fmt(run.duration_ms, 0)),
        h("td", { class: "num" }, fmt(run.rows_sent, 0)), h("td", { class: "num" }, fmt(run.inserted, 0)),
        h("td", { class: "num" }, fmt(run.updated, 0)), h("td", { class: "num" }, fmt(run.deleted, 0)),
        h("td", { class: "error" }, run.error ?? ""),
        h("td", {}, run.status === "awaiting_approval" ? [
          writeButton("Approve", async () => { await decide(run.id, "approve"); }, { class: "approve" }),
          writeButton("Reject", async () => { await decide(run.id, "reject"); }, { class: "danger" })] : null))))));
  };
  const decide = async (run, what) => {
    const d = await api("POST", `/api/runs/${encodeURIComponent(run)}/${what}`);
    message.textContent = d.ok ? `Run ${run}: ${what}d.` : errorText(d);
    await loadRuns();
  };
  main.append(h("h1", {}, `Sync ${id}`), message,
    h("div", { class: "actions" },
      writeButton("Run now", async () => {
        const run = await api("POST", `${path}/runs`);
        message.textContent = run.ok ? `Run ${run.body.run_id} started.` : errorText(run);
        await loadRuns();
      }, { id: "run-now" }),
      h("button", { class: "secondary", id: "preview-button", onclick: async () => {
        const p = await api("GET", `${path}/preview?sample=10`);
        preview.replaceChildren(p.ok
          ? h("div", {}, h("p", {}, `${fmt(p.body.total, 0)} rows: ${fmt(p.body.inserted, 0)} to insert, ${fmt(p.body.updated, 0)} to update, ${fmt(p.body.deleted, 0)} to delete`),
              h("pre", {}, p.body.sample.map((row) => JSON.stringify(row)).join("\n")))
          : h("p", { class: "error" }, errorText(p)));
      } }, "Preview next run"),
      writeButton("Delete", async () => {
        if (!confirm(`Delete sync ${id}?`)) return;
        const d = await api("DELETE", path);
        if (d.ok) location.hash = "#/syncs"; else message.textContent = errorText(d);
      }, { id: "delete-sync", class: "danger" })),
    preview,
    h("div", { class: "card" }, h("h2", {}, "Runs"), runs),
    h("div", { class: "card" }, h("h2", {}, "Config"), h("pre", {}, JSON.stringify(r.body.config, null, 2))));
  await loadRuns();
  const timer = setInterval(loadRuns, 2000);
  return () => clearInterval(timer);
}
