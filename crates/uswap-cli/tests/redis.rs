//! A real server under `uswap run`: redis-server (jemalloc, which gives
//! memory back with MADV_DONTNEED and MADV_FREE, and a fork for every
//! background save) holds over twice its limit. Every value read
//! back is checked against what the test wrote, and the save written by
//! the forked child, loaded by a redis-server without uswap, holds what
//! the parent held. `.ci/run` installs redis-server when it is missing; a
//! machine without it fails this test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const USWAP: &str = env!("CARGO_BIN_EXE_uswap");

/// One reply of the server.
#[derive(Debug, PartialEq)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

struct Client {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Client {
    /// Connects, retrying while the server starts (at most 60 s).
    fn connect(port: u16) -> Client {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
                    return Client {
                        input: BufReader::new(s.try_clone().unwrap()),
                        out: s,
                    };
                }
                Err(e) if Instant::now() > deadline => panic!("connecting to redis: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Sends commands in one write, then reads one reply each.
    fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Reply> {
        let mut buf = Vec::new();
        for args in commands {
            buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                buf.extend_from_slice(a);
                buf.extend_from_slice(b"\r\n");
            }
        }
        self.out.write_all(&buf).unwrap();
        commands.iter().map(|_| self.reply()).collect()
    }

    fn call(&mut self, args: &[&str]) -> Reply {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        self.pipeline(&[args]).pop().unwrap()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.input.read_line(&mut l).unwrap();
        assert!(l.ends_with("\r\n"), "a reply line cut short: {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn reply(&mut self) -> Reply {
        let l = self.line();
        let (kind, rest) = l.split_at(1);
        match kind {
            "+" => Reply::Status(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().unwrap()),
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Reply::Bulk(None);
                }
                let mut b = vec![0; n as usize + 2];
                self.input.read_exact(&mut b).unwrap();
                b.truncate(n as usize);
                Reply::Bulk(Some(b))
            }
            "*" => {
                let n: usize = rest.parse().unwrap();
                Reply::Array((0..n).map(|_| self.reply()).collect())
            }
            _ => panic!("not a reply: {l:?}"),
        }
    }

    fn status(&mut self, args: &[&str]) -> String {
        match self.call(args) {
            Reply::Status(s) => s,
            Reply::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    /// A field of INFO's answer.
    fn info(&mut self, section: &str, field: &str) -> String {
        let text = self.status(&["INFO", section]);
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in {text}"))
            .to_string()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn server(wrapper: &[&str], port: u16, dir: &Path) -> Child {
    let mut cmd = Command::new(wrapper.first().copied().unwrap_or("redis-server"));
    if !wrapper.is_empty() {
        cmd.args(&wrapper[1..]).arg("redis-server");
    }
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .args(["--enable-debug-command", "yes", "--loglevel", "warning"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting redis-server ({e}): .ci/run installs it"))
}

/// Waits for the server to exit (at most 60 s) and returns its output.
fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("redis-server did not exit: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status, text)
}

fn value(i: usize) -> Vec<u8> {
    let tail: String = (0..40)
        .map(|j| (b'a' + ((i * j * 7 + j) % 26) as u8) as char)
        .collect();
    format!("value-{i}-{tail}").repeat(7).into_bytes()
}

fn set(key: String, v: &[u8]) -> Vec<Vec<u8>> {
    vec![b"SET".to_vec(), key.into_bytes(), v.to_vec()]
}

/// Reads every key of the model back (MGET, 500 at a time).
fn check(c: &mut Client, model: &BTreeMap<String, Vec<u8>>, stage: &str) {
    let keys: Vec<&String> = model.keys().collect();
    for chunk in keys.chunks(500) {
        let mut args = vec![b"MGET".to_vec()];
        args.extend(chunk.iter().map(|k| k.as_bytes().to_vec()));
        let Reply::Array(values) = c.pipeline(&[args]).pop().unwrap() else {
            panic!("MGET answered no array");
        };
        for (k, v) in chunk.iter().zip(values) {
            assert!(
                v == Reply::Bulk(Some(model[*k].clone())),
                "{stage}: {k} holds {v:?}"
            );
        }
    }
}

#[test]
fn redis_holding_over_twice_its_limit_forks_saves_and_reads_back_what_it_was_given() {
    let dir = std::env::temp_dir().join(format!("uswap-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stats = dir.join("stats");
    let port = free_port();
    let stats_arg = stats.to_str().unwrap();
    let managed = server(
        &[
            USWAP,
            "run",
            "--memory-high",
            "10M",
            "--stats-file",
            stats_arg,
            "--",
        ],
        port,
        &dir,
    );
    let mut c = Client::connect(port);
    let keys = 60_000;
    let mut model = BTreeMap::new();
    let mut load = Vec::new();
    for i in 0..keys {
        let v = value(i);
        load.push(set(format!("key:{i}"), &v));
        model.insert(format!("key:{i}"), v);
    }
    for chunk in load.chunks(2000) {
        for r in c.pipeline(chunk) {
            assert_eq!(r, Reply::Status("OK".into()));
        }
    }
    let used: u64 = c.info("memory", "used_memory").parse().unwrap();
    assert!(used > 5 * (10 << 20) / 2, "redis holds only {used} bytes");
    check(&mut c, &model, "after the load");
    let loaded = c.status(&["DEBUG", "DIGEST"]);
    // A background save: a forked child writes everything the parent holds.
    assert!(c.status(&["BGSAVE"]).contains("started"));
    let deadline = Instant::now() + Duration::from_secs(300);
    while c.info("persistence", "rdb_bgsave_in_progress") != "0" {
        assert!(Instant::now() < deadline, "the save did not end: a hang");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.info("persistence", "rdb_last_bgsave_status"), "ok");
    // Churn: a third deleted (memory given back), a seventh grown.
    let mut churn = Vec::new();
    for i in (0..keys).step_by(3) {
        churn.push(vec![b"DEL".to_vec(), format!("key:{i}").into_bytes()]);
        model.remove(&format!("key:{i}"));
    }
    for i in (1..keys).step_by(7) {
        let k = format!("key:{i}");
        if let Some(v) = model.get_mut(&k) {
            v.extend_from_slice(&b"tail".repeat(20));
            churn.push(vec![b"APPEND".to_vec(), k.into_bytes(), b"tail".repeat(20)]);
        }
    }
    for chunk in churn.chunks(2000) {
        for r in c.pipeline(chunk) {
            assert!(matches!(r, Reply::Int(_)), "{r:?}");
        }
    }
    check(&mut c, &model, "after the churn");
    // Gone: the connection closes as the server exits.
    c.out
        .write_all(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        .unwrap();
    let (status, out) = finish(managed);
    assert!(status.success(), "{status:?}: {out}");
    // The supervisor says nothing but, perhaps, that some memory did not
    // compress.
    assert!(
        !out.lines()
            .any(|l| l.contains("uswap:") && !l.contains("did not compress")),
        "{out}"
    );
    let c_stats = std::fs::read_to_string(&stats).unwrap();
    let counter = |name: &str| -> u64 {
        c_stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {c_stats}"))
            .parse()
            .unwrap()
    };
    assert!(counter("forks") >= 1, "{c_stats}");
    assert!(
        counter("zswpout") > 0 && counter("pgmajfault") > 0,
        "{c_stats}"
    );
    assert_eq!((counter("sigbus"), counter("decompress_fail")), (0, 0));
    // The child's save, loaded by redis-server alone.
    let port = free_port();
    let plain = server(&[], port, &dir);
    let mut c = Client::connect(port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.info("persistence", "loading") != "0" {
        assert!(Instant::now() < deadline, "loading the save did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.status(&["DEBUG", "DIGEST"]), loaded, "the save differs");
    c.out
        .write_all(b"*2\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n")
        .unwrap();
    let (status, out) = finish(plain);
    assert!(status.success(), "{status:?}: {out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
