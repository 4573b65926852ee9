//! An HTTP API as a reverse ETL destination: JSON posted in batches.

mod target;

pub use target::{
    DeleteForm, HttpApiConfig, HttpApiTarget, HttpMethod, redact_url, restore_url_password, url_password,
};
