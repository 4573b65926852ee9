//! End-to-end tests: the real `sluice` binary, over real HTTP, on a real DuckDB workspace.

mod broker;
mod harness;
mod http_target;
mod kinesis_local;
mod mariadb;
mod moto;
mod postgres;

mod api;
mod crash;
mod debezium_capture;
mod debezium_fidelity;
mod debezium_real;
mod destinations;
mod destinations_mariadb;
mod destinations_sqlite;
mod hardening;
mod kafka;
mod kafka_faults;
mod kafka_hardening;
mod kinesis;
mod mirror;
mod postgres_cdc;
mod postgres_keyless;
mod postgres_tls;
mod push;
mod replay;
mod reverse_etl;
mod reverse_etl_files;
mod reverse_etl_http;
mod schema;
mod soak;
mod sql_access;
mod sql_limits;
