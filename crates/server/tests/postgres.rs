//! A throwaway PostgreSQL 15 with `wal_level=logical` on a free 127.0.0.1 port, run as the
//! `postgres` system user (scripts/services/postgres.sh installs the Debian packages).

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub const BIN: &str = "/usr/lib/postgresql/15/bin";

pub struct Postgres {
    pub dir: PathBuf,
    pub port: u16,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a PostgreSQL tool");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Postgres {
    /// initdb, configure for logical replication, start, and create the `etl` user (LOGIN
    /// REPLICATION) owning the `etltest` database.
    pub fn start() -> Self {
        Self::start_with("wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n")
    }

    /// Start with these replication settings instead.
    pub fn start_with(replication: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = std::env::temp_dir().join(format!("sluice-pg-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "postgres").unwrap();
        run(Command::new("chmod").arg("755").arg(&dir));
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir));
        let data = dir.join("data");
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{BIN}/initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                &format!("--pwfile={}", dir.join("pw").display()),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]));
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n{replication}\
             fsync = off\nfull_page_writes = off\n",
            dir.display()
        );
        let mut existing = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        existing.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), existing).unwrap();
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{BIN}/pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("log"))
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null()));
        let pg = Self { dir, port };
        pg.admin("CREATE ROLE etl WITH LOGIN REPLICATION PASSWORD 'etl'");
        pg.admin("CREATE DATABASE etltest OWNER etl");
        pg.admin("CREATE ROLE plain WITH LOGIN PASSWORD 'plain'");
        pg
    }

    /// Write `script` to `file` and run it as `etl` on `etltest` with psql in the background,
    /// statement by statement, stopping at the first error.
    pub fn run_script(&self, file: &std::path::Path, script: &str) -> std::process::Child {
        std::fs::write(file, script).unwrap();
        Command::new(format!("{BIN}/psql"))
            .env("PGPASSWORD", "etl")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "etl", "-d", "etltest", "-q", "-v"])
            .args(["ON_ERROR_STOP=1", "-f"])
            .arg(file)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// `pg_ctl stop` (fast) or `start`: the server goes away and comes back on its port.
    pub fn ctl(&self, action: &str) {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{BIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "-m", "fast", action])
            .stdout(Stdio::null()));
    }

    /// SQL as the superuser, over the Unix socket.
    pub fn admin(&self, sql: &str) -> String {
        run(Command::new(format!("{BIN}/psql"))
            .args(["-h", self.dir.to_str().unwrap(), "-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres"])
            .args(["-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql]))
    }

    /// SQL as `etl` on `etltest`, over TCP with its password; rows as `|`-separated lines.
    pub fn sql(&self, sql: &str) -> String {
        run(Command::new(format!("{BIN}/psql"))
            .env("PGPASSWORD", "etl")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "etl", "-d", "etltest"])
            .args(["-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql]))
    }
}

impl Postgres {
    /// Turn TLS on: a throwaway CA signs a certificate for 127.0.0.1, and TCP connections
    /// without TLS are refused (replication ones too). Returns the CA file and another CA's.
    pub fn enable_tls(&self) -> (PathBuf, PathBuf) {
        let d = self.dir.clone();
        let sh = |script: &str| run(Command::new("sh").arg("-c").arg(script).current_dir(&d));
        sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=sluice-test-ca 2>/dev/null
            openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj /CN=other-ca 2>/dev/null
            openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
            printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile san.ext 2>/dev/null
            chown postgres:postgres server.key server.crt && chmod 600 server.key");
        let data = d.join("data");
        let hba = std::fs::read_to_string(data.join("pg_hba.conf")).unwrap();
        let refuse = "hostnossl all all 127.0.0.1/32 reject\nhostnossl replication all 127.0.0.1/32 reject\n";
        std::fs::write(data.join("pg_hba.conf"), format!("{refuse}{hba}")).unwrap();
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        conf.push_str(&format!(
            "ssl = on\nssl_cert_file = '{0}/server.crt'\nssl_key_file = '{0}/server.key'\n",
            d.display()
        ));
        std::fs::write(data.join("postgresql.conf"), conf).unwrap();
        self.admin("SELECT pg_reload_conf()");
        (d.join("ca.crt"), d.join("other.crt"))
    }

    /// Rows of `sql` as `etl`, one `|`-separated line each.
    pub fn lines(&self, sql: &str) -> Vec<String> {
        self.sql(sql).lines().map(str::to_string).collect()
    }

    /// Rows in `table` of `database`, 0 while it does not exist.
    pub fn count_in(&self, database: &str, table: &str) -> i64 {
        if self.lines_in(database, &format!("SELECT to_regclass('{table}') IS NOT NULL"))[0] != "t" {
            return 0;
        }
        self.lines_in(database, &format!("SELECT count(*) FROM {table}"))[0].parse().unwrap()
    }

    /// Rows of `sql` as `etl` in `database`, one `|`-separated line each.
    pub fn lines_in(&self, database: &str, sql: &str) -> Vec<String> {
        run(Command::new(format!("{BIN}/psql"))
            .env("PGPASSWORD", "etl")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "etl", "-d", database])
            .args(["-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql]))
        .lines()
        .map(str::to_string)
        .collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(format!("{BIN}/pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
