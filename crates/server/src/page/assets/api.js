// The session and every call to the API: the access token lives in sessionStorage (gone when
// the tab closes) and is refreshed a minute before it expires, or once after a 401.

const KEY = "sluice.session";
let session = JSON.parse(sessionStorage.getItem(KEY) || "null");
let refreshing = null;
let timer = null;

export function current() { return session; }

export function canWrite() { return !!session && (session.role === "admin" || session.role === "editor"); }

export function isAdmin() { return !!session && session.role === "admin"; }

function keep(s) {
  session = { access_token: s.access_token, refresh_token: s.refresh_token, user: s.user, role: s.role,
              expires_at: Date.now() + s.expires_in * 1000 };
  sessionStorage.setItem(KEY, JSON.stringify(session));
  schedule();
}

function schedule() {
  clearTimeout(timer);
  if (!session) return;
  const wait = Math.max(5000, session.expires_at - Date.now() - 60000);
  timer = setTimeout(() => refresh(), wait);
}

export async function login(user, password) {
  const r = await fetch("/api/auth/login", { method: "POST", headers: { "content-type": "application/json" },
                                              body: JSON.stringify({ user, password }) });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || `login failed (${r.status})`);
  keep(body);
  return session;
}

export async function logout() {
  if (session) {
    await fetch("/api/auth/logout", { method: "POST", headers: { "content-type": "application/json" },
                                      body: JSON.stringify({ refresh_token: session.refresh_token }) }).catch(() => {});
  }
  session = null;
  sessionStorage.removeItem(KEY);
  clearTimeout(timer);
}

async function refresh() {
  if (!session) return false;
  if (!refreshing) {
    refreshing = (async () => {
      const r = await fetch("/api/auth/refresh", { method: "POST", headers: { "content-type": "application/json" },
                                                   body: JSON.stringify({ refresh_token: session.refresh_token }) });
      if (!r.ok) { session = null; sessionStorage.removeItem(KEY); return false; }
      keep(await r.json());
      return true;
    })().finally(() => { refreshing = null; });
  }
  return refreshing;
}

/** Call the API: `{status, ok, body}`; the body is JSON when the answer is. */
export async function api(method, path, body) {
  const send = () => fetch(path, {
    method,
    headers: { authorization: `Bearer ${session ? session.access_token : ""}`,
               ...(body !== undefined ? { "content-type": "application/json" } : {}) },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  let r = await send();
  if (r.status === 401 && await refresh()) r = await send();
  if (r.status === 401) window.dispatchEvent(new Event("sluice:logged-out"));
  const text = await r.text();
  let parsed = text;
  try { parsed = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
  return { status: r.status, ok: r.ok, body: parsed };
}

/** Read server-sent events from `path` with fetch() streaming, which sends the token in the
 *  Authorization header (an EventSource cannot). Calls `on(kind, data)`; stops on `signal`. */
export async function events(path, on, signal) {
  for (let attempt = 0; !signal.aborted; attempt++) {
    try {
      let r = await fetch(path, { headers: { authorization: `Bearer ${session.access_token}` }, signal });
      if (r.status === 401 && await refresh()) continue;
      if (!r.ok) { on("error", { status: r.status }); return; }
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let kind = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
          }
          if (data) { try { on(kind, JSON.parse(data)); } catch (_) { on(kind, data); } }
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    await new Promise((ok) => setTimeout(ok, Math.min(5000, 500 * (attempt + 1))));
  }
}

schedule();
