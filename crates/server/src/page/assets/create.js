// Create a stream: a form for an HTTP push stream (name, table, metadata columns, mode, keys,
// batching), or any stream config as JSON (Kafka, Kinesis, Postgres, a destination).

import { h, errorText, writeButton } from "/ui/app.js";
import { api } from "/ui/api.js";

const METADATA = ["received_at", "position"];

export async function render(main) {
  const result = h("div", { id: "create-result" });
  const form = h("form", { id: "new-stream", class: "card" },
    h("h1", {}, "New HTTP push stream"),
    h("label", {}, "Name (letters, digits, _ and -)", h("input", { name: "name", required: true, pattern: "[A-Za-z0-9_-]+" })),
    h("label", {}, "Table", h("input", { name: "table", required: true })),
    h("fieldset", {}, h("legend", {}, "Metadata columns"),
      METADATA.map((m) => h("label", { class: "inline" }, h("input", { type: "checkbox", name: `meta_${m}` }), `_${m}`))),
    h("label", {}, "Mode", h("select", { name: "mode" }, h("option", { value: "append" }, "append: every event is a row"),
      h("option", { value: "mirror" }, "mirror: one row per key"))),
    h("label", {}, "Keys (mirror mode, comma-separated)", h("input", { name: "keys" })),
    h("label", {}, "Write a batch at the latest after (ms)", h("input", { name: "max_wait_ms", type: "number", min: 1, max: 60000, value: 250 })),
    writeButton("Create stream", null, { type: "submit", id: "create-stream" }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(form);
    const config = {
      name: d.get("name"), table: d.get("table"), source: { type: "http_push" },
      metadata: Object.fromEntries(METADATA.map((m) => [m, d.get(`meta_${m}`) === "on"])),
      mode: d.get("mode"), flush: { max_wait_ms: Number(d.get("max_wait_ms")) || 250 },
    };
    const keys = String(d.get("keys") || "").split(",").map((k) => k.trim()).filter(Boolean);
    if (keys.length) config.keys = keys;
    await create(config, result);
  });

  const raw = h("textarea", { rows: 12, id: "stream-json" }, JSON.stringify({
    name: "orders", table: "orders",
    source: { type: "kafka", brokers: ["127.0.0.1:9092"], topics: ["orders"] },
  }, null, 2));
  const advanced = h("div", { class: "card" }, h("h2", {}, "Any stream, as JSON"),
    h("p", { class: "muted" }, "The same config as the API and the YAML file (see the README's stream config table)."),
    raw, h("div", { class: "actions" },
      writeButton("Test source", async () => {
        let config; try { config = JSON.parse(raw.value); } catch (err) { result.textContent = err.message; return; }
        const r = await api("POST", "/api/sources/test", { name: config.name, source: config.source });
        result.replaceChildren(r.ok ? h("pre", {}, JSON.stringify(r.body, null, 2)) : h("p", { class: "error" }, errorText(r)));
      }, { class: "secondary" }),
      writeButton("Create from JSON", async () => {
        let config; try { config = JSON.parse(raw.value); } catch (err) { result.textContent = err.message; return; }
        await create(config, result);
      })));
  main.append(form, result, advanced);
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
