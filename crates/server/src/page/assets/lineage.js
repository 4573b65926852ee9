// Lineage: source → stream → table → sync → destination, one column per kind, as SVG.

import { h, errorText } from "/ui/app.js";
import { api } from "/ui/api.js";

const COLUMNS = ["source", "stream", "table", "sync", "destination"];
const COLORS = { source: "#eef4ff", stream: "#dcfae6", table: "#fef0c7", sync: "#f4ebff", destination: "#fde2e1" };

export async function render(main) {
  const r = await api("GET", "/api/lineage");
  if (!r.ok) { main.append(h("p", { class: "error" }, errorText(r))); return; }
  const { nodes, edges } = r.body;
  main.append(h("h1", {}, "Lineage"),
    h("p", { class: "muted" }, "Where each table comes from and where it goes, from the running streams and syncs."),
    h("div", { class: "card", id: "lineage" }, nodes.length ? graph(nodes, edges) : h("p", { class: "muted" }, "Nothing yet.")));
}

function graph(nodes, edges) {
  const ns = "http://www.w3.org/2000/svg";
  const box = { w: 210, h: 34, gapX: 60, gapY: 14 };
  const place = {};
  let rows = 0;
  COLUMNS.forEach((kind, col) => {
    const mine = nodes.filter((n) => n.kind === kind);
    mine.forEach((n, row) => { place[n.id] = { x: 10 + col * (box.w + box.gapX), y: 30 + row * (box.h + box.gapY), n }; });
    rows = Math.max(rows, mine.length);
  });
  const width = 20 + COLUMNS.length * (box.w + box.gapX) - box.gapX;
  const height = 40 + rows * (box.h + box.gapY);
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("id", "lineage-graph");
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  COLUMNS.forEach((kind, col) => el("text", { x: 10 + col * (box.w + box.gapX), y: 16, fill: "#6b7280" }, `${kind}s`));
  for (const e of edges) {
    const a = place[e.from], b = place[e.to];
    if (!a || !b) continue;
    const x1 = a.x + box.w, y1 = a.y + box.h / 2, x2 = b.x, y2 = b.y + box.h / 2, mid = (x1 + x2) / 2;
    el("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, fill: "none", stroke: "#98a2b3", "stroke-width": 1.5,
                 "data-from": e.from, "data-to": e.to, class: "edge" });
  }
  for (const { x, y, n } of Object.values(place)) {
    const g = document.createElementNS(ns, "g");
    g.setAttribute("class", "node");
    g.setAttribute("data-id", n.id);
    g.setAttribute("data-kind", n.kind);
    const rect = document.createElementNS(ns, "rect");
    for (const [k, v] of Object.entries({ x, y, width: box.w, height: box.h, rx: 6, fill: COLORS[n.kind] || "#fff", stroke: "#98a2b3" })) rect.setAttribute(k, v);
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", x + 8); label.setAttribute("y", y + 21);
    label.textContent = n.label.length > 30 ? `${n.label.slice(0, 29)}…` : n.label;
    const title = document.createElementNS(ns, "title");
    title.textContent = n.label;
    g.append(rect, label, title);
    if (n.kind === "stream" || n.kind === "sync") {
      g.style.cursor = "pointer";
      g.addEventListener("click", () => { location.hash = `#/${n.kind}s/${encodeURIComponent(n.label)}`; });
    }
    svg.append(g);
  }
  return svg;
}
