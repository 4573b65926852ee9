//! Roles, and the one table of which role each route needs.
//!
//! | role | may |
//! |---|---|
//! | `viewer` | every `GET` route (streams, syncs, runs, metrics, `/metrics`) |
//! | `agent` | what a viewer may, and request a sync run, which waits for an editor's approval |
//! | `editor` | what a viewer may, and every write: streams, syncs, runs, replay, resnapshot, approvals, `/api/sql` |
//! | `admin` | everything, and users and tokens |
//!
//! The page (`/`, `/ui/…`) is open; the feeds, schema and metrics history and lineage it reads
//! need a viewer's role.
//!
//! Open to all: `/health`, login, refresh and logout, and the push route (which checks its
//! stream's push key), and `/metrics` when `--open-metrics` says so.

use std::fmt;

use axum::http::Method;
use serde::{Deserialize, Serialize};

/// What a user or token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Users and tokens, and everything an editor may.
    Admin,
    /// Every write but users and tokens.
    Editor,
    /// Reads.
    Viewer,
    /// Reads, and sync run requests that wait for approval.
    Agent,
}

impl Role {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Editor => "editor",
            Self::Viewer => "viewer",
            Self::Agent => "agent",
        }
    }

    /// A stored or requested name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "admin" => Some(Self::Admin),
            "editor" => Some(Self::Editor),
            "viewer" => Some(Self::Viewer),
            "agent" => Some(Self::Agent),
            _ => None,
        }
    }

    /// Whether this role may use a route that needs `need`.
    pub fn grants(self, need: Need) -> bool {
        match need {
            Need::Open | Need::Any | Need::Viewer => true,
            Need::RunRequest => self != Self::Viewer,
            Need::Editor => matches!(self, Self::Admin | Self::Editor),
            Need::Admin => self == Self::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: no token.
    Open,
    /// Any valid token.
    Any,
    /// A viewer's role or more.
    Viewer,
    /// An editor's, or an agent's (whose run then waits for approval).
    RunRequest,
    /// An editor's or admin's.
    Editor,
    /// An admin's.
    Admin,
}

impl Need {
    /// The roles that satisfy it, for a 403's message.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Open | Self::Any | Self::Viewer => "any role",
            Self::RunRequest => "the editor, admin or agent role",
            Self::Editor => "the editor or admin role",
            Self::Admin => "the admin role",
        }
    }
}

/// What the route `path` (as matched: `/api/streams/{id}`) needs for `method`.
pub fn need(method: &Method, path: &str, open_metrics: bool) -> Need {
    match path {
        "/health" | "/api/auth/login" | "/api/auth/refresh" | "/api/auth/logout" => Need::Open,
        // The page's files hold no data; what they show comes from the API with a token.
        "/" | "/ui/{*path}" => Need::Open,
        // What the page watches: the live feeds, schema history, metrics history, lineage.
        "/api/streams/{id}/feed"
        | "/api/activity"
        | "/api/streams/{id}/schema"
        | "/api/streams/{id}/metrics/history"
        | "/api/streams/{id}/rejects"
        | "/api/lineage"
            if method == Method::GET =>
        {
            Need::Viewer
        }
        "/metrics" if open_metrics => Need::Open,
        "/api/auth/me" => Need::Any,
        _ if path.starts_with("/api/users") || path.starts_with("/api/tokens") => Need::Admin,
        "/api/syncs/{id}/runs" if method == Method::POST => Need::RunRequest,
        _ if method == Method::GET || method == Method::HEAD => Need::Viewer,
        _ => Need::Editor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_gets_what_the_table_says() {
        let open = false;
        let get = |p| need(&Method::GET, p, open);
        let post = |p| need(&Method::POST, p, open);
        assert_eq!(get("/api/streams"), Need::Viewer);
        assert_eq!(post("/api/streams"), Need::Editor);
        assert_eq!(post("/api/sql"), Need::Editor);
        assert_eq!(need(&Method::DELETE, "/api/syncs/{id}", open), Need::Editor);
        assert_eq!(post("/api/syncs/{id}/runs"), Need::RunRequest);
        assert_eq!(get("/api/users"), Need::Admin);
        assert_eq!(need(&Method::DELETE, "/api/tokens/{id}", open), Need::Admin);
        assert_eq!(get("/metrics"), Need::Viewer);
        assert_eq!(need(&Method::GET, "/metrics", true), Need::Open);
        assert_eq!(post("/api/auth/login"), Need::Open);
        assert_eq!(get("/"), Need::Open);
        assert_eq!(get("/ui/{*path}"), Need::Open);
        for path in ["/api/streams/{id}/feed", "/api/activity", "/api/streams/{id}/schema", "/api/lineage"] {
            assert_eq!(get(path), Need::Viewer);
        }
        assert_eq!(get("/api/streams/{id}/metrics/history"), Need::Viewer);

        assert!(Role::Viewer.grants(Need::Viewer) && !Role::Viewer.grants(Need::Editor));
        assert!(!Role::Viewer.grants(Need::RunRequest));
        assert!(Role::Agent.grants(Need::RunRequest) && !Role::Agent.grants(Need::Editor));
        assert!(Role::Editor.grants(Need::Editor) && !Role::Editor.grants(Need::Admin));
        assert!(Role::Admin.grants(Need::Admin));
        for role in [Role::Admin, Role::Editor, Role::Viewer, Role::Agent] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }
}
