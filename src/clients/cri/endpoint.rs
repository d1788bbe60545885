//! Runtime endpoint parsing: `unix:///path/to.sock`, `unix:/path`, or a bare absolute path.

use std::path::PathBuf;

use super::CriError;

/// Where the runtime listens. Only Unix sockets are supported, as on every Linux node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEndpoint {
    /// The endpoint as the user wrote it, for messages.
    pub original: String,
    /// The socket's path on this machine.
    pub socket: PathBuf,
}

impl RuntimeEndpoint {
    /// The `unix://` form tonic understands.
    pub fn uri(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

/// Accepts what upstream's `--container-runtime-endpoint` accepts on Linux.
pub fn parse_endpoint(text: &str) -> Result<RuntimeEndpoint, CriError> {
    let trimmed = text.trim();
    let path = if let Some(rest) = trimmed.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = trimmed.strip_prefix("unix:") {
        rest
    } else if trimmed.contains("://") {
        return Err(CriError::Endpoint {
            endpoint: text.to_string(),
            reason: "only unix:// endpoints are supported".into(),
        });
    } else {
        trimmed
    };
    if !path.starts_with('/') {
        return Err(CriError::Endpoint {
            endpoint: text.to_string(),
            reason: "the socket path must be absolute".into(),
        });
    }
    Ok(RuntimeEndpoint {
        original: text.to_string(),
        socket: PathBuf::from(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        let table = [
            (
                "unix:///run/containerd/containerd.sock",
                Some("/run/containerd/containerd.sock"),
            ),
            ("unix:/run/c.sock", Some("/run/c.sock")),
            ("/run/c.sock", Some("/run/c.sock")),
            ("  /run/c.sock ", Some("/run/c.sock")),
            ("tcp://127.0.0.1:1234", None),
            ("run/c.sock", None),
            ("unix://relative.sock", None),
            ("", None),
        ];
        for (input, want) in table {
            let got = parse_endpoint(input).ok().map(|e| e.socket);
            assert_eq!(got, want.map(PathBuf::from), "input {input:?}");
        }
    }
}
