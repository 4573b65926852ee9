//! Files (Parquet, CSV, JSON lines) in a local folder or an S3 bucket, through `object_store`.

mod encode;
mod target;

pub use target::{FileFormat, FilesConfig, FilesTarget, S3Config};
