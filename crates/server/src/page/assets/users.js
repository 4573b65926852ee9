// Users and API tokens, for admins.

import { h, errorText } from "/ui/app.js";
import { api } from "/ui/api.js";

const ROLES = ["viewer", "editor", "agent", "admin"];

export async function render(main) {
  const message = h("p", { id: "users-message", class: "error" });
  const users = h("div", { id: "users" });
  const tokens = h("div", { id: "tokens" });
  const shown = h("div", { id: "new-token" });
  const roleSelect = (name) => h("select", { name }, ROLES.map((r) => h("option", { value: r }, r)));

  const load = async () => {
    const [u, t] = await Promise.all([api("GET", "/api/users"), api("GET", "/api/tokens")]);
    if (!u.ok) { message.textContent = errorText(u); return; }
    users.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["User", "Role", "Password", "Created", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, u.body.users.map((x) => h("tr", { "data-user": x.name },
        h("td", {}, x.name), h("td", {}, x.role), h("td", {}, x.has_password ? "set" : "none"),
        h("td", {}, new Date(x.created_at).toLocaleString()),
        h("td", {}, h("button", { class: "danger", onclick: async () => {
          if (!confirm(`Remove user ${x.name}?`)) return;
          const d = await api("DELETE", `/api/users/${encodeURIComponent(x.name)}`);
          message.textContent = d.ok ? "" : errorText(d);
          load();
        } }, "Remove")))))));
    if (t.ok) tokens.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["Token", "Name", "Role", "Created by", "Created", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, t.body.tokens.map((x) => h("tr", { "data-token": x.id },
        h("td", {}, x.id), h("td", {}, x.name), h("td", {}, x.role), h("td", {}, x.created_by),
        h("td", {}, new Date(x.created_at).toLocaleString()),
        h("td", {}, h("button", { class: "danger", onclick: async () => {
          const d = await api("DELETE", `/api/tokens/${encodeURIComponent(x.id)}`);
          message.textContent = d.ok ? "" : errorText(d);
          load();
        } }, "Revoke")))))));
  };

  const userForm = h("form", { id: "new-user", class: "card" }, h("h2", {}, "New user"),
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Role", roleSelect("role")),
    h("label", {}, "Password", h("input", { name: "password", type: "password", required: true })),
    h("button", { type: "submit" }, "Create user"));
  userForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(userForm);
    const r = await api("POST", "/api/users", { name: d.get("name"), role: d.get("role"), password: d.get("password") });
    message.textContent = r.ok ? "" : errorText(r);
    if (r.ok) userForm.reset();
    load();
  });
  const tokenForm = h("form", { id: "new-token-form", class: "card" }, h("h2", {}, "New API token"),
    h("label", {}, "Name", h("input", { name: "name", required: true })),
    h("label", {}, "Role", roleSelect("role")),
    h("button", { type: "submit" }, "Create token"));
  tokenForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(tokenForm);
    const r = await api("POST", "/api/tokens", { name: d.get("name"), role: d.get("role") });
    message.textContent = r.ok ? "" : errorText(r);
    shown.replaceChildren(r.ok ? h("div", { class: "card" }, "The token, shown once: ", h("div", { class: "secret" }, r.body.token)) : "");
    load();
  });
  main.append(h("h1", {}, "Users and tokens"), message,
    h("div", { class: "row" }, h("div", {}, h("h2", {}, "Users"), users, userForm),
      h("div", {}, h("h2", {}, "API tokens"), tokens, shown, tokenForm)));
  await load();
}
