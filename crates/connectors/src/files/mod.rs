//! Files (Parquet, CSV, JSON lines) in a local folder, S3, Azure Blob or Google Cloud
//! Storage: a sync's result per run (`target.rs`), or a stream's rows in rotated files
//! (`stream.rs`).

mod config;
mod encode;
pub mod gcs;
mod names;
mod spool;
mod store;
mod stream;
mod target;

pub(crate) use config::default_region;
pub use config::{AzureConfig, Compression, FileFormat, FilesConfig, Rotate, S3Config};
pub(crate) use encode::encode;
pub(crate) use store::s3_store;
pub use stream::FilesStream;
pub use target::FilesTarget;
