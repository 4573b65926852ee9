// Named connections: a Postgres or MySQL server, a Kafka cluster, an AWS account, defined once
// and named by streams and syncs (`"connection": "<name>"`). The list with who uses each, and a
// form (generated from the connection type's JSON Schema) to add or change one, with Test
// connection.

import { h, errorText, writeButton } from "/ui/app.js";
import { api } from "/ui/api.js";
import { schemaForm } from "/ui/form.js";
import { checks } from "/ui/syncs.js";

export async function render(main, [id]) {
  const [schema, list] = await Promise.all([api("GET", "/api/schema/connection"), api("GET", "/api/connections")]);
  if (!schema.ok || !list.ok) { main.append(h("p", { class: "error" }, errorText(schema.ok ? list : schema))); return; }
  const message = h("p", { id: "connections-message", class: "error" });
  const existing = id ? list.body.connections.find((c) => c.id === id) : null;
  const table = h("table", { id: "connections" }, h("thead", {}, h("tr", {}, ["Connection", "Kind", "Used by", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, list.body.connections.map((c) => h("tr", { "data-connection": c.id },
      h("td", {}, h("a", { href: `#/connections/${encodeURIComponent(c.id)}` }, c.id)), h("td", {}, c.config.kind),
      h("td", {}, [...c.used_by.streams.map((s) => `stream ${s}`), ...c.used_by.syncs.map((s) => `sync ${s}`)].join(", ") || h("span", { class: "muted" }, "nothing")),
      h("td", {}, writeButton("Delete", async () => {
        if (!confirm(`Delete connection ${c.id}?`)) return;
        const d = await api("DELETE", `/api/connections/${encodeURIComponent(c.id)}`);
        if (d.ok) window.dispatchEvent(new HashChangeEvent("hashchange")); else message.textContent = errorText(d);
      }, { class: "danger" }))))));
  const form = schemaForm(schema.body, existing ? existing.config : { kind: "postgres" });
  const result = h("div", { id: "connection-result" });
  const value = () => {
    try { return form.value(); } catch (err) { result.replaceChildren(h("p", { class: "error" }, err.message)); return null; }
  };
  const element = h("form", { id: "connection-form", class: "card" },
    h("h2", {}, existing ? `Change connection ${existing.id}` : "New connection"),
    h("p", { class: "muted" }, existing
      ? "Streams that name it restart with the change; syncs use it from their next run. A secret left empty keeps the stored one."
      : "Streams and syncs name it as \"connection\" in their source or destination; the fields it gives are its own."),
    form.element,
    h("div", { class: "actions" },
      writeButton("Test connection", async () => {
        const config = value(); if (!config) return;
        const r = await api("POST", "/api/connections/test", config);
        result.replaceChildren(checks(r));
      }, { type: "button", class: "secondary", id: "test-connection" }),
      writeButton(existing ? "Save" : "Create connection", null, { type: "submit", id: "save-connection" })));
  if (existing) element.querySelector("input[name=name]").readOnly = true;
  element.addEventListener("submit", async (e) => {
    e.preventDefault();
    const config = value(); if (!config) return;
    const r = existing
      ? await api("PUT", `/api/connections/${encodeURIComponent(existing.id)}`, config)
      : await api("POST", "/api/connections", config);
    if (!r.ok) { result.replaceChildren(h("p", { class: "error", id: "connection-error" }, errorText(r))); return; }
    if (r.body.not_applied) { result.replaceChildren(h("p", { class: "error" }, `Saved; not applied to: ${r.body.not_applied.join("; ")}`)); return; }
    location.hash = "#/connections";
    window.dispatchEvent(new HashChangeEvent("hashchange"));
  });
  main.append(h("h1", {}, "Connections"), message, table, element, result);
}
