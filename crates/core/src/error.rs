//! One error type for the core, with a kind that tells the runtime what to do with it.

use std::fmt;

/// What the runtime does with an error: retry, reject the data, or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A configuration value is wrong; fix the config. Never retried.
    Config,
    /// A peer could not be reached; retried with backoff.
    Connect,
    /// A temporary failure (lock, timeout, busy); retried with backoff.
    Transient,
    /// The input itself is bad; it goes to the rejects ledger.
    Data,
    /// The disk of the data folder is full (or the store is being reopened after it was): the
    /// write stored nothing, and waits for room instead of a backoff; never the data's fault.
    Storage,
    /// Anything else; the stream stops and reports it.
    Fatal,
}

/// The core's error.
#[derive(Debug, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Result with the core's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), source: None }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// A config error naming the field at fault.
    pub fn config(field: &str, problem: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Config, format!("{field}: {problem}"))
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Connect | ErrorKind::Transient)
    }

    /// Whether the error says nothing of the data: a try that fails with it decides nothing
    /// about which rows a destination refuses.
    pub fn may_pass(&self) -> bool {
        self.is_retryable() || self.kind == ErrorKind::Storage
    }

    /// The message without the source chain.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}
