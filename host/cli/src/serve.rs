//! A small static file server for the browser demo (`policyport serve-web`): the files of `web/` (the pages, the
//! built wasm bundles under `web/pkg/`, onnxruntime-web under `web/node_modules/`) plus in-memory files (the
//! bundled policies compiled at start-up).
//!
//! Why hand-rolled on `std::net`: the CLI needs GET of local files and nothing else, and an async HTTP stack
//! would double the CLI's dependency tree. Why the headers: `Cross-Origin-Opener-Policy` +
//! `Cross-Origin-Embedder-Policy` make the page cross-origin isolated, which gives `performance.now()` 5 µs
//! resolution instead of 100 µs (the latency chart measures single act() calls) and lets onnxruntime-web use
//! its threaded build in the benchmark page. Caching is off: a rebuilt bundle is picked up on reload.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Limits that keep one client from holding the server: the request line and all headers together are read
/// through an 8 KiB window, a connection idle for 10 s is closed, at most 64 connections are served at once
/// (the rest are closed at accept), and only regular files up to 256 MiB under the root are served.
/// (Before: unbounded `read_line`, no timeouts, a thread per connection, any file type — a FIFO blocked a
/// thread forever, `/dev/zero` through a symlink exhausted memory.)
pub const MAX_REQUEST_HEAD: u64 = 8 << 10;
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_CONNECTIONS: usize = 64;
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// What the server serves: a directory tree plus files held in memory (which win over the tree).
#[derive(Debug, Clone, Default)]
pub struct Site {
    pub root: PathBuf,
    pub memory: BTreeMap<String, Vec<u8>>,
}

/// A response: status, content type, body.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

pub fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "ts" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file a URL path names under `root`, or None when it would leave the root (`..`, absolute parts).
pub fn resolve(root: &Path, url_path: &str) -> Option<PathBuf> {
    let path = url_path.split(['?', '#']).next().unwrap_or("");
    let decoded = percent_decode(path)?;
    let rel = decoded.trim_start_matches('/');
    let rel = if rel.is_empty() || rel.ends_with('/') {
        format!("{rel}index.html")
    } else {
        rel.to_string()
    };
    let mut out = root.to_path_buf();
    for c in Path::new(&rel).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.contains('\0')).then_some(s)
}

impl Site {
    /// Answer one GET.
    pub fn get(&self, url_path: &str) -> Response {
        let key = url_path.split(['?', '#']).next().unwrap_or("");
        if let Some(body) = self.memory.get(key) {
            return Response {
                status: 200,
                content_type: content_type(key),
                body: body.clone(),
            };
        }
        let not_found = |why: &str| Response {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: format!("404 {why}: {key}\n").into_bytes(),
        };
        let Some(path) = resolve(&self.root, url_path) else {
            return not_found("outside the served directory");
        };
        // Symlinks are followed only when the target stays under the root, and only regular files of a sane
        // size are read.
        let inside = match (path.canonicalize(), self.root.canonicalize()) {
            (Ok(p), Ok(r)) => p.starts_with(&r),
            _ => false,
        };
        let regular =
            std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= MAX_FILE_BYTES);
        if !inside || !regular {
            return not_found("not found");
        }
        match std::fs::read(&path) {
            Ok(body) => Response {
                status: 200,
                content_type: content_type(&path.to_string_lossy()),
                body,
            },
            Err(_) => not_found("not found"),
        }
    }
}

fn handle(site: &Site, stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_REQUEST_HEAD));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Drain the headers (a GET has no body we need), within the same 8 KiB window.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let resp = if method == "GET" || method == "HEAD" {
        site.get(target)
    } else {
        Response {
            status: 405,
            content_type: "text/plain; charset=utf-8",
            body: b"only GET\n".to_vec(),
        }
    };
    let reason = match resp.status {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         Cross-Origin-Opener-Policy: same-origin\r\nCross-Origin-Embedder-Policy: require-corp\r\n\
         Cross-Origin-Resource-Policy: same-origin\r\nConnection: close\r\n\r\n",
        resp.status,
        resp.content_type,
        resp.body.len()
    )?;
    if method != "HEAD" {
        out.write_all(&resp.body)?;
    }
    out.flush()
}

/// Serve `site` on `listener` until the process ends (a thread per connection, at most [`MAX_CONNECTIONS`]).
pub fn serve(listener: TcpListener, site: Site) -> std::io::Result<()> {
    let site = Arc::new(site);
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            drop(stream);
            continue;
        }
        let (site, mine) = (site.clone(), open.clone());
        let spawned = std::thread::Builder::new().spawn(move || {
            let _ = handle(&site, stream);
            mine.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::SeqCst);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn paths_stay_inside_the_root() {
        let root = Path::new("/srv/web");
        assert_eq!(resolve(root, "/"), Some(root.join("index.html")));
        assert_eq!(
            resolve(root, "/pkg/cpu/a.js?x=1"),
            Some(root.join("pkg/cpu/a.js"))
        );
        assert_eq!(resolve(root, "/a%20b.html"), Some(root.join("a b.html")));
        assert_eq!(resolve(root, "/../etc/passwd"), None);
        assert_eq!(resolve(root, "/pkg/%2e%2e/%2e%2e/secret"), None);
        assert_eq!(resolve(root, "/%00"), None);
        assert_eq!(resolve(root, "/%zz"), None);
    }

    #[test]
    fn serves_memory_files_and_the_tree_over_http() {
        let dir = std::env::temp_dir().join(format!("pp-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("index.html"), "<p>hi</p>").unwrap();
        let mut memory = BTreeMap::new();
        memory.insert("/policies/x.policy".to_string(), vec![1, 2, 3]);
        let site = Site {
            root: dir.clone(),
            memory,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || serve(listener, site));
        let fetch = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut r = vec![];
            s.read_to_end(&mut r).unwrap();
            String::from_utf8_lossy(&r).into_owned()
        };
        let page = fetch("/");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("Cross-Origin-Embedder-Policy: require-corp"));
        assert!(page.ends_with("<p>hi</p>"));
        let policy = fetch("/policies/x.policy");
        assert!(policy.contains("application/octet-stream") && policy.ends_with("\u{1}\u{2}\u{3}"));
        assert!(fetch("/../Cargo.toml").starts_with("HTTP/1.1 404"));
        assert!(fetch("/missing.js").starts_with("HTTP/1.1 404"));
        // A symlink out of the root and a special file are not served.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc/hostname", dir.join("out.txt")).unwrap();
            std::os::unix::fs::symlink("/dev/zero", dir.join("zero.bin")).unwrap();
            assert!(fetch("/out.txt").starts_with("HTTP/1.1 404"));
            assert!(fetch("/zero.bin").starts_with("HTTP/1.1 404"));
        }
        // A request line that never ends is cut at 8 KiB and answered or closed (never buffered without bound;
        // the server may reset the connection while the client still writes), and the server keeps serving.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(1 << 20));
        let _ = s.write_all(long.as_bytes());
        let mut r = vec![];
        match s.read_to_end(&mut r) {
            Ok(_) => {
                // The 404 may arrive cut short: the server closes with the client's megabyte still unread, and
                // the reset that follows can end the read mid-head (seen once in CI as a non-404 reply; the
                // message says what arrived if it recurs).
                let text = String::from_utf8_lossy(&r);
                assert!(
                    text.starts_with("HTTP/1.1 404") || "HTTP/1.1 404".starts_with(&*text),
                    "an over-long request line got {:?}",
                    &text[..text.len().min(200)]
                )
            }
            Err(e) => assert_ne!(
                e.kind(),
                std::io::ErrorKind::WouldBlock,
                "the server kept reading"
            ),
        }
        assert!(fetch("/").starts_with("HTTP/1.1 200"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
