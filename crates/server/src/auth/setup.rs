//! The first start, and the token the CLI uses.
//!
//! A workspace without users gets an `admin` user (with `SLUICE_ADMIN_PASSWORD` as its password
//! when that is set; without it the admin has no password until one is set through the API) and
//! an admin API token named `setup`. The token is printed once on stderr and written to
//! `admin.token` in the data dir, readable by its owner only, where `sluice sql` and
//! `sluice sync` find it. `SLUICE_TOKEN` takes its place for the CLI.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Auth, AuthError, Role};

/// The token file in the data dir.
pub const TOKEN_FILE: &str = "admin.token";
/// The first admin's name.
const ADMIN: &str = "admin";

/// Create the admin and its token when the workspace has no users yet.
pub async fn first_start(auth: &Auth, data_dir: &Path) -> Result<(), AuthError> {
    if !auth.users().await?.is_empty() {
        if std::env::var_os("SLUICE_ADMIN_PASSWORD").is_some() {
            tracing::info!("SLUICE_ADMIN_PASSWORD is read only on the first start; users exist, so it is ignored.");
        }
        return Ok(());
    }
    let password = std::env::var("SLUICE_ADMIN_PASSWORD").ok().filter(|p| !p.is_empty());
    let with_password = password.is_some();
    auth.add_user(ADMIN, Role::Admin, password).await.map_err(|e| match e {
        AuthError::Invalid(why) => AuthError::Invalid(format!("SLUICE_ADMIN_PASSWORD: {why}")),
        e => e,
    })?;
    let created = auth.add_token("setup", Role::Admin, ADMIN).await?;
    let path = data_dir.join(TOKEN_FILE);
    write_private(&path, &created.token)
        .map_err(|e| AuthError::Invalid(format!("cannot write {}: {e}", path.display())))?;
    eprintln!("First start: created the user 'admin'.");
    eprintln!("  admin API token (shown once): {}", created.token);
    eprintln!("  also in {} (mode 0600), where `sluice sql` and `sluice sync` find it.", path.display());
    if !with_password {
        eprintln!(
            "  The admin has no password yet: set one with PATCH /api/users/admin {{\"password\": \"…\"}} and this \
             token, or start the first time with SLUICE_ADMIN_PASSWORD."
        );
    }
    Ok(())
}

/// Write `token` to `path` with mode 0600, replacing it whole.
fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("token.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    file.write_all(format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The token the CLI sends: `SLUICE_TOKEN`, or else the data dir's `admin.token`.
pub fn cli_token(data_dir: &Path) -> Option<String> {
    if let Some(token) = std::env::var("SLUICE_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        return Some(token.trim().to_string());
    }
    let text = std::fs::read_to_string(token_path(data_dir)).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// Where the data dir keeps the admin token.
pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKEN_FILE)
}

/// What the CLI says when the server refused its token.
pub fn cli_hint(data_dir: &Path) -> String {
    format!(
        "the server needs a token: set SLUICE_TOKEN, or give --data-dir of the server so {} is read",
        token_path(data_dir).display()
    )
}
