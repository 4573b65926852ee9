// Bake the prebuilt DuckDB library's folder into the binary's rpath, so `sluice` runs without
// LD_LIBRARY_PATH. With the `bundled` feature DuckDB is linked in and this does nothing useful.
fn main() {
    println!("cargo:rerun-if-env-changed=DUCKDB_LIB_DIR");
    if let Ok(dir) = std::env::var("DUCKDB_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
