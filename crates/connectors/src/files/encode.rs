//! Batches to file bytes: Parquet, CSV with a header, or JSON lines, compressed as configured.

use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression as Codec, GzipLevel};
use parquet::file::properties::WriterProperties;
use sluice_core::{Error, ErrorKind, Result};

use super::config::{Compression, FileFormat};

/// Encode batches (all of `schema`) as one file.
pub(crate) fn encode(
    format: FileFormat,
    compression: Compression,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<Vec<u8>> {
    let plain = encode_plain(format, compression, schema, batches)?;
    if format == FileFormat::Parquet || compression != Compression::Gzip {
        return Ok(plain);
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(plain.len() / 4), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &plain)
        .and_then(|()| gz.finish())
        .map_err(|e| Error::new(ErrorKind::Fatal, "cannot gzip the file").with_source(e))
}

fn encode_plain(
    format: FileFormat,
    compression: Compression,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match format {
        FileFormat::Parquet => {
            let codec = match compression {
                Compression::None => Codec::UNCOMPRESSED,
                Compression::Snappy => Codec::SNAPPY,
                Compression::Gzip => Codec::GZIP(GzipLevel::default()),
            };
            let props = WriterProperties::builder().set_compression(codec).build();
            // Without the fields' extension marks (a JSON column's `arrow.json` is for
            // destinations with a JSON type of their own): readers that do not know an
            // extension type refuse the file, and JSON stays the text it is.
            let fields: Vec<Field> =
                schema.fields().iter().map(|f| f.as_ref().clone().with_metadata(Default::default())).collect();
            let plain: SchemaRef = Arc::new(Schema::new(fields));
            let mut writer = ArrowWriter::try_new(&mut out, plain.clone(), Some(props)).map_err(parquet_error)?;
            for batch in batches {
                let batch = RecordBatch::try_new(plain.clone(), batch.columns().to_vec()).map_err(arrow_error)?;
                writer.write(&batch).map_err(parquet_error)?;
            }
            writer.close().map_err(parquet_error)?;
        }
        FileFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(&mut out);
            if batches.is_empty() {
                // A header alone, so an empty result is still a readable file.
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                drop(writer);
                out.extend(names.join(",").as_bytes());
                out.push(b'\n');
                return Ok(out);
            }
            for batch in batches {
                writer.write(batch).map_err(arrow_error)?;
            }
        }
        FileFormat::Jsonl => {
            let mut writer = arrow::json::LineDelimitedWriter::new(&mut out);
            for batch in batches {
                writer.write(batch).map_err(arrow_error)?;
            }
            writer.finish().map_err(arrow_error)?;
        }
    }
    Ok(out)
}

/// Rows and deletes as one change file: every column plus `_sluice_op` (`upsert` or
/// `delete`); a delete carries only its key columns.
pub(crate) fn change_batches(
    schema: &SchemaRef,
    rows: &[RecordBatch],
    deletes: &[RecordBatch],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
    fields.push(Field::new("_sluice_op", DataType::Utf8, false));
    let out_schema = Arc::new(Schema::new(fields));
    let mut out = Vec::new();
    for batch in rows {
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(StringArray::from(vec!["upsert"; batch.num_rows()])) as ArrayRef);
        out.push(RecordBatch::try_new(out_schema.clone(), columns).map_err(arrow_error)?);
    }
    for batch in deletes {
        let n = batch.num_rows();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for field in schema.fields() {
            match batch.schema().index_of(field.name()) {
                Ok(i) => columns.push(arrow::compute::cast(batch.column(i), field.data_type()).map_err(arrow_error)?),
                Err(_) => columns.push(new_null_array(field.data_type(), n)),
            }
        }
        columns.push(Arc::new(StringArray::from(vec!["delete"; n])) as ArrayRef);
        out.push(RecordBatch::try_new(out_schema.clone(), columns).map_err(arrow_error)?);
    }
    Ok((out_schema, out))
}

fn parquet_error(e: parquet::errors::ParquetError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot write Parquet").with_source(e)
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot encode the file").with_source(e)
}
