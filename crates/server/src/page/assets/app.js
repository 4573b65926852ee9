// The page: a login form, then one view per hash route. Views are modules with
// `render(main, params, ctx)`; each may return a function that stops what it started.

import { api, current, login, logout, canWrite, isAdmin } from "/ui/api.js";
import * as pipelines from "/ui/pipelines.js";
import * as stream from "/ui/stream.js";
import * as create from "/ui/create.js";
import * as sql from "/ui/sql.js";
import * as syncs from "/ui/syncs.js";
import * as lineage from "/ui/lineage.js";
import * as users from "/ui/users.js";
import * as connections from "/ui/connections.js";

/** Build an element: `h("td", {class: "num"}, "3")`. Text is always text, never HTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A button for a write: disabled, with the reason, for a role that may not write. */
export function writeButton(label, onclick, attrs = {}) {
  const allowed = canWrite();
  return h("button", { ...attrs, onclick, disabled: !allowed, "data-write": true,
                       title: allowed ? null : "needs the editor or admin role" }, label);
}

export function state(s) { return h("span", { class: `state ${s}` }, s); }

export function errorText(r) {
  return (r.body && r.body.error) ? `${r.status}: ${r.body.error}` : `error ${r.status}`;
}

export function fmt(n, digits = 1) {
  if (n === null || n === undefined) return "";
  return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
}

const routes = [
  [/^#\/pipelines$/, pipelines],
  [/^#\/streams\/([^/]+)$/, stream],
  [/^#\/new-stream$/, create],
  [/^#\/streams\/([^/]+)\/edit$/, create],
  [/^#\/sql$/, sql],
  [/^#\/syncs(?:\/([^/]+))?(?:\/(edit))?$/, syncs],
  [/^#\/lineage$/, lineage],
  [/^#\/users$/, users],
  [/^#\/connections(?:\/([^/]+))?$/, connections],
];

const main = document.getElementById("view");
let stop = null;

async function show() {
  if (stop) { try { stop(); } catch (_) { /* already stopped */ } stop = null; }
  main.replaceChildren();
  if (!current()) return showLogin();
  document.getElementById("nav").hidden = false;
  document.querySelector("[data-admin]").hidden = !isAdmin();
  const who = document.getElementById("who");
  who.replaceChildren(`${current().user} (${current().role})`,
    h("button", { class: "secondary", id: "logout", onclick: async () => { await logout(); show(); } }, "Log out"));
  const hash = location.hash || "#/pipelines";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", hash.startsWith(a.getAttribute("href")));
  for (const [pattern, view] of routes) {
    const m = hash.match(pattern);
    if (m) {
      stop = await view.render(main, m.slice(1).map((p) => p && decodeURIComponent(p)), { api, h }) || null;
      return;
    }
  }
  location.hash = "#/pipelines";
}

function showLogin() {
  document.getElementById("nav").hidden = true;
  document.getElementById("who").replaceChildren();
  main.append(document.getElementById("login-form").content.cloneNode(true));
  const form = document.getElementById("login");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    try {
      await login(data.get("user"), data.get("password"));
      show();
    } catch (err) {
      document.getElementById("login-error").textContent = err.message;
    }
  });
}

window.addEventListener("hashchange", show);
window.addEventListener("sluice:logged-out", () => { if (!current()) show(); });
show();
