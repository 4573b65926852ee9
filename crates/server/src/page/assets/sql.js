// The SQL workbench: one read-only statement, its results in a grid, and "Send results to…",
// which opens a new sync with the statement.

import { h, errorText, writeButton, fmt } from "/ui/app.js";
import { api } from "/ui/api.js";

export async function render(main) {
  const editor = h("textarea", { id: "sql-editor", rows: 8, spellcheck: "false" },
    sessionStorage.getItem("sluice.sql") || "SELECT * FROM duckdb_tables() WHERE schema_name = 'main'");
  const status = h("p", { id: "sql-status", class: "muted" });
  const grid = h("div", { class: "grid", id: "sql-results" });
  const run = async () => {
    sessionStorage.setItem("sluice.sql", editor.value);
    status.className = "muted";
    status.textContent = "Running…";
    const started = performance.now();
    const r = await api("POST", "/api/sql", { sql: editor.value, limit: 1000 });
    if (!r.ok) { status.className = "error"; status.textContent = errorText(r); grid.replaceChildren(); return; }
    const { columns, rows, truncated } = r.body;
    const names = columns.map((c) => (Array.isArray(c) ? c[0] : c.name ?? c));
    status.textContent = `${fmt(rows.length, 0)} rows${truncated ? " (more exist)" : ""} in ${fmt(performance.now() - started, 0)} ms`;
    grid.replaceChildren(h("table", {},
      h("thead", {}, h("tr", {}, names.map((n) => h("th", {}, n)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, names.map((n) => {
        const v = row[n];
        return h("td", {}, v === null ? "NULL" : typeof v === "object" ? JSON.stringify(v) : String(v));
      }))))));
  };
  editor.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); } });
  main.append(h("h1", {}, "SQL"),
    h("p", { class: "muted" }, "One read-only SELECT or WITH statement on the workspace. Ctrl+Enter runs it."),
    editor,
    h("div", { class: "actions" },
      writeButton("Run", run, { id: "sql-run" }),
      writeButton("Send results to…", () => {
        sessionStorage.setItem("sluice.sync-sql", editor.value);
        location.hash = "#/syncs/new";
      }, { id: "send-results", class: "secondary" })),
    status, grid);
}
