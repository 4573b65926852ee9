// Create or edit a stream: a form generated from the stream config's JSON Schema (the same type
// the API and the YAML file read), with Test source; or any config pasted as JSON.

import { h, errorText, writeButton } from "/ui/app.js";
import { api } from "/ui/api.js";
import { schemaForm } from "/ui/form.js";
import { checks } from "/ui/syncs.js";

export async function render(main, [id]) {
  const schema = await api("GET", "/api/schema/stream");
  if (!schema.ok) { main.append(h("p", { class: "error" }, errorText(schema))); return; }
  let existing = null;
  if (id) {
    const r = await api("GET", `/api/streams/${encodeURIComponent(id)}`);
    if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
    existing = r.body.config;
  }
  const result = h("div", { id: "create-result" });
  // An edit is a merge patch: a field emptied is sent as null, which removes it.
  const form = schemaForm(schema.body, existing || { source: { type: "http_push" } }, { clear: !!existing });
  const value = () => {
    try { return form.value(); } catch (err) { result.replaceChildren(h("p", { class: "error" }, err.message)); return null; }
  };
  const element = h("form", { id: "new-stream", class: "card" },
    h("h1", {}, id ? `Edit stream ${id}` : "New stream"),
    h("p", { class: "muted" }, "Fields left empty take their defaults; a secret left empty keeps the stored one."),
    form.element,
    h("div", { class: "actions" },
      writeButton("Test source", async () => {
        const config = value(); if (!config) return;
        const r = await api("POST", "/api/sources/test", { name: config.name || id || "test", source: config.source || { type: "http_push" } });
        result.replaceChildren(checks(r));
      }, { type: "button", class: "secondary", id: "test-source" }),
      writeButton("Test destination", async () => {
        const config = value(); if (!config) return;
        if (!config.destination) { result.replaceChildren(h("p", {}, "No destination: the rows land in the workspace.")); return; }
        result.replaceChildren(checks(await api("POST", "/api/destinations/test", { destination: config.destination })));
      }, { type: "button", class: "secondary", id: "test-destination" }),
      writeButton(id ? "Save" : "Create stream", null, { type: "submit", id: "create-stream" })));
  if (id) element.querySelector("input[name=name]").readOnly = true;
  element.addEventListener("submit", async (e) => {
    e.preventDefault();
    const config = value(); if (!config) return;
    if (!id) { await create(config, result); return; }
    delete config.name;
    const r = await api("PATCH", `/api/streams/${encodeURIComponent(id)}`, config);
    if (r.ok) location.hash = `#/streams/${encodeURIComponent(id)}`;
    else result.replaceChildren(h("p", { class: "error", id: "create-error" }, errorText(r)));
  });
  if (id) { main.append(element, result); return; }

  const raw = h("textarea", { rows: 12, id: "stream-json" }, JSON.stringify({
    name: "orders", table: "orders",
    source: { type: "kafka", brokers: ["127.0.0.1:9092"], topics: ["orders"] },
  }, null, 2));
  const advanced = h("div", { class: "card" }, h("h2", {}, "Or paste a config as JSON"),
    h("p", { class: "muted" }, "The same config as the form, the API and the YAML file."),
    raw, h("div", { class: "actions" },
      writeButton("Create from JSON", async () => {
        let config; try { config = JSON.parse(raw.value); } catch (err) { result.textContent = err.message; return; }
        await create(config, result);
      })));
  main.append(element, result, advanced);
}

async function create(config, result) {
  const r = await api("POST", "/api/streams", config);
  if (!r.ok) { result.replaceChildren(h("p", { class: "error", id: "create-error" }, errorText(r))); return; }
  const key = r.body.push_key;
  result.replaceChildren(h("div", { class: "card", id: "created" },
    h("p", {}, "Stream ", h("a", { href: `#/streams/${encodeURIComponent(r.body.id)}` }, r.body.id), " created."),
    key ? [h("p", {}, "Its push key, shown once:"), h("div", { class: "secret", id: "push-key" }, key),
           h("p", {}, "Push with: ", h("code", {}, `curl ${location.origin}${r.body.push_url} -H 'authorization: Bearer ${key}' -d '{"hello": 1}'`))] : null));
}
