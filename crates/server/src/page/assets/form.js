// Forms generated from a config type's JSON Schema (`GET /api/schema/:kind`, derived from the
// Rust types the API and the YAML file read), so a field added to a config shows up here.
//
// schemaForm(schema, value) → { element, value() }: objects become fieldsets, tagged unions (a
// `oneOf` whose variants share a `const` field such as `type` or `kind`) a select that swaps the
// variant's fields, enums a select, booleans a checkbox, numbers a number input, secrets
// (`writeOnly`) a password input, lists of strings one item per line, anything else JSON. Each
// input is named by its path (`source.brokers`, `destination.kind`). value() leaves out what
// was left empty, so the server's defaults apply and a stored secret stays; with
// `{ clear: true }` (an edit sent as a merge patch) a field that had a value and was emptied is
// sent as null, which removes it.

import { h } from "/ui/app.js";

export function schemaForm(schema, value = {}, { clear = false } = {}) {
  const defs = schema.$defs || {};
  const resolve = (s) => {
    while (s && s.$ref) s = { ...defs[s.$ref.replace("#/$defs/", "")], description: s.description ?? defs[s.$ref.replace("#/$defs/", "")]?.description, default: s.default };
    return s || {};
  };
  resolve.clear = clear;
  const field = build(schema, value, "", resolve, true);
  return { element: field.element, value: () => field.get() ?? {} };
}

/** The variants of `s` if it is a tagged union: `{ tag, variants: [[const, schema]] }`. */
function union(s, resolve) {
  const options = (s.oneOf || s.anyOf || []).map(resolve).filter((v) => v.type !== "null");
  if (options.length < 1 || !options.every((v) => v.properties)) return null;
  const tag = Object.keys(options[0].properties).find((k) => options.every((v) => v.properties[k]?.const !== undefined));
  return tag ? { tag, variants: options.map((v) => [v.properties[tag].const, v]) } : null;
}

/** Unit-variant enums: `enum: [...]`, or a `oneOf` of `const`s. */
function choices(s) {
  if (Array.isArray(s.enum)) return s.enum;
  const options = s.oneOf || s.anyOf;
  if (options && options.every((o) => o.const !== undefined || o.type === "null")) return options.filter((o) => o.type !== "null").map((o) => o.const);
  return null;
}

function nullable(s) {
  return (s.anyOf || s.oneOf || []).some((o) => o.type === "null") || (Array.isArray(s.type) && s.type.includes("null"));
}

function help(s) {
  const text = (s.description || "").split("\n").join(" ");
  return text ? h("small", { class: "muted help" }, text) : null;
}

function build(raw, value, path, resolve, top = false) {
  let s = resolve(raw);
  const optional = nullable(s);
  const inner = (s.anyOf || []).find((o) => o.type !== "null");
  if (inner && !s.oneOf && !union(s, resolve) && !choices(s)) s = { ...resolve(inner), description: s.description, default: s.default };
  const name = path.split(".").pop();
  const tagged = union(s, resolve);
  if (tagged) return taggedField(s, tagged, value, path, resolve, optional || (raw.anyOf || []).some((o) => o.type === "null"));
  const enumerated = choices(s);
  if (enumerated) {
    // Left at "(default)", nothing is sent and the server's default applies.
    const none = s.default !== undefined ? `(default: ${s.default})` : optional ? "(none)" : null;
    const select = h("select", { name: path },
      none ? h("option", { value: "" }, none) : null,
      enumerated.map((c) => h("option", { value: c }, String(c))));
    select.value = value ?? (none ? "" : enumerated[0]);
    return labelled(name, s, select, () => select.value === "" ? undefined : select.value);
  }
  const type = Array.isArray(s.type) ? s.type.find((t) => t !== "null") : s.type;
  if (type === "object" && s.properties) {
    const fields = Object.entries(s.properties).map(([k, p]) =>
      [k, build(p, value?.[k], path ? `${path}.${k}` : k, resolve)]);
    const element = top
      ? h("div", { class: "schema-form" }, fields.map(([, f]) => f.element))
      : h("fieldset", { "data-path": path }, h("legend", {}, name), help(s), fields.map(([, f]) => f.element));
    return { element, get: () => {
      const out = {};
      for (const [k, f] of fields) {
        const v = f.get();
        if (v !== undefined) out[k] = v;
        else if (resolve.clear && value?.[k] !== undefined && value?.[k] !== null) out[k] = null;
      }
      return Object.keys(out).length || top ? out : undefined;
    } };
  }
  if (type === "boolean") {
    const box = h("input", { type: "checkbox", name: path });
    box.checked = value ?? s.default ?? false;
    const initial = box.checked;
    return { element: h("label", { class: "inline" }, box, name, help(s)),
      get: () => (box.checked === initial && value === undefined && !box.checked ? undefined : box.checked) };
  }
  if (type === "integer" || type === "number") {
    const input = h("input", { type: "number", name: path, placeholder: s.default ?? "", step: type === "integer" ? 1 : "any" });
    if (value !== undefined && value !== null) input.value = value;
    return labelled(name, s, input, () => input.value === "" ? undefined : Number(input.value));
  }
  if (type === "array" && resolve(s.items).type === "string") {
    const area = h("textarea", { name: path, rows: 2, placeholder: "one per line" }, (value || []).join("\n"));
    return labelled(name, s, area, () => {
      const items = area.value.split("\n").map((x) => x.trim()).filter(Boolean);
      return items.length ? items : undefined;
    });
  }
  if (type === "string") {
    const secret = s.writeOnly || s.format === "password";
    const long = name === "query" || name === "sql";
    const input = long
      ? h("textarea", { name: path, rows: 5 }, value ?? "")
      : h("input", { name: path, type: secret ? "password" : "text", placeholder: secret && value === undefined ? "" : s.default ?? "" });
    if (!long && value !== undefined && value !== null) input.value = value;
    return labelled(name, s, input, () => input.value === "" ? undefined : input.value);
  }
  // Maps, lists of objects, anything else: JSON.
  const area = h("textarea", { name: path, rows: 3, class: "json", placeholder: "JSON" }, value === undefined ? "" : JSON.stringify(value, null, 2));
  return labelled(name, s, area, () => {
    if (area.value.trim() === "") return undefined;
    try { return JSON.parse(area.value); } catch (e) { throw new Error(`${path}: ${e.message}`); }
  });
}

function labelled(name, s, input, get) {
  return { element: h("label", {}, name, input, help(s)), get };
}

function taggedField(s, { tag, variants }, value, path, resolve, optional) {
  const name = path.split(".").pop();
  const select = h("select", { name: path ? `${path}.${tag}` : tag },
    optional ? h("option", { value: "" }, name === "destination" ? "(none: the workspace)" : "(none)") : null,
    variants.map(([c]) => h("option", { value: c }, c)));
  const body = h("div", { class: "variant" });
  let current = null;
  const show = () => {
    const chosen = variants.find(([c]) => c === select.value);
    if (!chosen) { body.replaceChildren(); current = null; return; }
    const props = { ...chosen[1].properties };
    delete props[tag];
    const keep = value && value[tag] === chosen[0] ? value : {};
    current = build({ ...chosen[1], properties: props }, keep, path, resolve);
    body.replaceChildren(...current.element.childNodes.length ? [...current.element.childNodes].filter((n) => n.tagName !== "LEGEND") : []);
  };
  select.value = value?.[tag] ?? (optional ? "" : (s.default?.[tag] ?? variants[0][0]));
  select.addEventListener("change", show);
  show();
  return {
    element: h("fieldset", { "data-path": path }, h("legend", {}, name), help(s), select, body),
    get: () => {
      if (!current) return undefined;
      return { [tag]: select.value, ...(current.get() || {}) };
    },
  };
}
