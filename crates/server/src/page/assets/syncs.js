// Syncs: the list, a new sync (from "Send results to…" or blank), and one sync's runs, preview,
// run now, approvals and removal.

import { h, state, fmt, errorText, writeButton } from "/ui/app.js";
import { api } from "/ui/api.js";
import { schemaForm } from "/ui/form.js";

export async function render(main, [id, edit]) {
  if (id === "new") return syncForm(main, null);
  if (edit) return syncForm(main, id);
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

/** A new sync, or a change to `id`, from a form generated from the sync config's JSON Schema. */
async function syncForm(main, id) {
  const schema = await api("GET", "/api/schema/sync");
  if (!schema.ok) { main.append(h("p", { class: "error" }, errorText(schema))); return; }
  let initial = { query: sessionStorage.getItem("sluice.sync-sql") || "", mode: "replace", destination: { kind: "sqlite" } };
  if (id) {
    const r = await api("GET", `/api/syncs/${encodeURIComponent(id)}`);
    if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
    initial = r.body.config;
  }
  const form = schemaForm(schema.body, initial);
  const result = h("div", { id: "sync-result" });
  const value = () => {
    try { return form.value(); } catch (err) { result.replaceChildren(h("p", { class: "error" }, err.message)); return null; }
  };
  const element = h("form", { id: "new-sync", class: "card" },
    h("h1", {}, id ? `Edit sync ${id}` : "New sync"),
    h("p", { class: "muted" }, "Fields left empty take their defaults; a secret left empty keeps the stored one."),
    form.element,
    h("div", { class: "actions" },
      writeButton("Test destination", async () => {
        const config = value(); if (!config) return;
        const r = await api("POST", "/api/destinations/test", { destination: config.destination });
        result.replaceChildren(checks(r));
      }, { type: "button", class: "secondary", id: "test-destination" }),
      writeButton(id ? "Save" : "Create sync", null, { type: "submit", id: "create-sync" })));
  if (id) element.querySelector("input[name=name]").readOnly = true;
  element.addEventListener("submit", async (e) => {
    e.preventDefault();
    const config = value(); if (!config) return;
    const r = id
      ? await api("PUT", `/api/syncs/${encodeURIComponent(id)}`, config)
      : await api("POST", "/api/syncs", config);
    if (!r.ok) { result.replaceChildren(h("p", { class: "error", id: "sync-error" }, errorText(r))); return; }
    sessionStorage.removeItem("sluice.sync-sql");
    location.hash = `#/syncs/${encodeURIComponent(r.body.id)}`;
  });
  main.append(element, result);
}

/** The answer of a Test … button: each check with ✓ or ✗. */
export function checks(r) {
  return r.ok
    ? h("div", { id: "test-result", "data-ok": String(r.body.ok) }, r.body.checks.map((c) => h("p", { class: c.ok ? "" : "error" }, `${c.ok ? "✓" : "✗"} ${c.name}: ${c.message}`)))
    : h("p", { class: "error" }, errorText(r));
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
      writeButton("Edit", () => { location.hash = `#/syncs/${encodeURIComponent(id)}/edit`; }, { id: "edit-sync", class: "secondary" }),
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
