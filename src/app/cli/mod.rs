//! The `deckhand pods`, `deckhand validate` and `deckhand version` commands: for people on the
//! node (output for reading, `-o json` for scripts). `pods` reads the running agent over its
//! local socket (or a read-only port); `validate` reads files and runs nothing.

pub(crate) mod pods;
pub(crate) mod validate;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;

use crate::base::clock;
use crate::kubelet::source::NodeSecurity;

/// The commands `deckhand` runs instead of the agent when its first argument names one.
pub const COMMANDS: &[&str] = &["pods", "validate", "version"];

/// Most bytes read from the agent for one page (a node's full `PodList` is far smaller).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// How long the agent may take to answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(
    name = "deckhand",
    about = "Deckhand's commands for people on the node"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// This node's pods, their containers, and in one line why a pod is not running.
    Pods {
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
        /// The agent's root dir; its local socket is `<root-dir>/deckhand.sock`.
        #[arg(long = "root-dir", default_value = "/var/lib/kubelet")]
        root_dir: PathBuf,
        /// Read this socket instead of the one under the root dir.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Read a read-only port instead, e.g. `http://127.0.0.1:10255` (no probe details).
        #[arg(long, conflicts_with = "socket")]
        server: Option<String>,
    },
    /// Check static-pod manifests as the node would load them, without running anything.
    /// Exit code 0: every file would run; 1: some would not; 2: bad usage.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
        /// The node name static pods get as a suffix.
        #[arg(long = "hostname-override")]
        node_name: Option<String>,
    },
    /// Deckhand's version and the Kubernetes API level it implements.
    Version {
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Table,
    /// For scripts.
    Json,
}

/// Why a command failed; shown as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(
        "cannot reach the agent at {at}: {reason} (is deckhand running, and are you root? \
         --root-dir, --socket or --server point elsewhere)"
    )]
    Unreachable { at: String, reason: String },
    #[error("the agent at {at} answered {status}: {body}")]
    Status {
        at: String,
        status: u16,
        body: String,
    },
    #[error("the agent at {at} sent a page that is not a pod list: {reason}")]
    BadPage { at: String, reason: String },
    #[error("{0}")]
    Usage(String),
}

/// Runs one command; the process exit code comes back.
pub async fn run(cli: Cli) -> Result<u8, CliError> {
    match cli.command {
        Command::Pods {
            output,
            root_dir,
            socket,
            server,
        } => {
            let source =
                match server {
                    Some(url) => Source::Http(url.trim_end_matches('/').to_string()),
                    None => Source::Socket(socket.unwrap_or_else(|| {
                        crate::endpoints::read_only::local_socket_path(&root_dir)
                    })),
                };
            let list: List<Pod> =
                serde_json::from_slice(&source.get("/pods").await?).map_err(|e| {
                    CliError::BadPage {
                        at: source.describe(),
                        reason: e.to_string(),
                    }
                })?;
            // Probe details exist on the local socket only; without them the table still says
            // which container is not ready.
            let failing = match &source {
                Source::Socket(_) => source
                    .get("/debug/probes")
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or_default(),
                Source::Http(_) => Default::default(),
            };
            let rows = pods::rows(&list.items, &failing, clock::timestamp());
            match output {
                Output::Table => print!("{}", pods::render_table(&rows)),
                Output::Json => println!("{}", to_json(&rows)),
            }
            Ok(0)
        }
        Command::Validate {
            files,
            output,
            node_name,
        } => {
            let node_name = match node_name {
                Some(n) => n,
                None => crate::config::default_node_name()
                    .map_err(|e| CliError::Usage(e.to_string()))?,
            };
            let security = NodeSecurity::default();
            let reports: Vec<_> = files
                .iter()
                .map(|f| match read_manifest(f) {
                    Ok(bytes) => validate::check(f, &bytes, &node_name, &security),
                    Err(e) => validate::unreadable(f, &e),
                })
                .collect();
            match output {
                Output::Table => print!("{}", validate::render_text(&reports)),
                Output::Json => println!("{}", to_json(&reports)),
            }
            Ok(if reports.iter().all(|r| r.ok) { 0 } else { 1 })
        }
        Command::Version { output } => {
            let deckhand = env!("CARGO_PKG_VERSION");
            let kubelet = crate::kubelet::node::status::kubelet_version();
            match output {
                Output::Table => println!(
                    "deckhand {deckhand} (reports itself as kubelet {kubelet}; CRI runtime.v1)"
                ),
                Output::Json => println!(
                    "{}",
                    serde_json::json!({"deckhand": deckhand, "kubeletVersion": kubelet, "cri": "runtime.v1"})
                ),
            }
            Ok(0)
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Reads a manifest no larger than the loader accepts (a larger one is read just past the limit
/// so the loader reports it).
fn read_manifest(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(crate::kubelet::source::manifest::MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Where `deckhand pods` reads the agent.
enum Source {
    Socket(PathBuf),
    Http(String),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Socket(p) => p.display().to_string(),
            Source::Http(url) => url.clone(),
        }
    }

    /// GETs `path` and returns the body of a 200 answer.
    async fn get(&self, path: &str) -> Result<Bytes, CliError> {
        let at = self.describe();
        let unreachable = |reason: String| CliError::Unreachable {
            at: at.clone(),
            reason,
        };
        let request = async {
            let (uri, authority) = match self {
                Source::Socket(_) => (path.to_string(), "localhost".to_string()),
                Source::Http(url) => {
                    let parsed: hyper::Uri = format!("{url}{path}")
                        .parse()
                        .map_err(|e| unreachable(format!("{e}")))?;
                    if parsed.scheme_str() != Some("http") {
                        return Err(CliError::Usage(format!(
                            "--server {url}: only http:// (a read-only port) is supported"
                        )));
                    }
                    let authority = parsed
                        .authority()
                        .map(|a| a.to_string())
                        .ok_or_else(|| unreachable("no host in the URL".into()))?;
                    (path.to_string(), authority)
                }
            };
            let req = hyper::Request::get(uri)
                .header(hyper::header::HOST, &authority)
                .body(Empty::<Bytes>::new())
                .map_err(|e| unreachable(e.to_string()))?;
            let response = match self {
                Source::Socket(p) => {
                    let stream = tokio::net::UnixStream::connect(p)
                        .await
                        .map_err(|e| unreachable(e.to_string()))?;
                    send(stream, req).await
                }
                Source::Http(_) => {
                    let stream = tokio::net::TcpStream::connect(&authority)
                        .await
                        .map_err(|e| unreachable(e.to_string()))?;
                    send(stream, req).await
                }
            }
            .map_err(|e| unreachable(e.to_string()))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .to_bytes();
            if status != 200 {
                return Err(CliError::Status {
                    at: at.clone(),
                    status,
                    body: String::from_utf8_lossy(&body).trim().to_string(),
                });
            }
            Ok(body)
        };
        tokio::time::timeout(REQUEST_TIMEOUT, request)
            .await
            .unwrap_or_else(|_| Err(unreachable(format!("no answer within {REQUEST_TIMEOUT:?}"))))
    }
}

/// One HTTP/1.1 exchange on `stream`.
async fn send<S>(
    stream: S,
    req: hyper::Request<Empty<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await
}
