use std::sync::Mutex;

use super::*;
use proto::registration_server::{Registration, RegistrationServer};

fn id(inode: u64) -> SocketId {
    SocketId { inode, mtime_ns: 1 }
}

fn plugin(inode: u64) -> Registered {
    Registered {
        id: id(inode),
        kind: CSI_PLUGIN.into(),
        name: "d".into(),
        endpoint: "/e".into(),
    }
}

#[test]
fn reconcile_table() {
    let now = clock::instant();
    let p = |s: &str| PathBuf::from(s);
    let later = Failed {
        id: id(1),
        until: now + Duration::from_secs(1),
        wait: BACKOFF_FIRST,
    };
    let over = Failed {
        until: now,
        ..later
    };
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, SocketId)>,
        Vec<(&'a str, Registered)>,
        Vec<(&'a str, Failed)>,
        Vec<Step>,
    );
    let cases: Vec<Case> = vec![
        (
            "new socket",
            vec![("/a", id(1))],
            vec![],
            vec![],
            vec![Step::Register(p("/a"))],
        ),
        (
            "registered, unchanged",
            vec![("/a", id(1))],
            vec![("/a", plugin(1))],
            vec![],
            vec![],
        ),
        (
            "socket gone",
            vec![],
            vec![("/a", plugin(1))],
            vec![],
            vec![Step::Deregister(p("/a"))],
        ),
        (
            "socket made again",
            vec![("/a", id(2))],
            vec![("/a", plugin(1))],
            vec![],
            vec![Step::Deregister(p("/a")), Step::Register(p("/a"))],
        ),
        (
            "failed, backing off",
            vec![("/a", id(1))],
            vec![],
            vec![("/a", later)],
            vec![],
        ),
        (
            "failed, back-off over",
            vec![("/a", id(1))],
            vec![],
            vec![("/a", over)],
            vec![Step::Register(p("/a"))],
        ),
        (
            "failed, made again",
            vec![("/a", id(2))],
            vec![],
            vec![("/a", later)],
            vec![Step::Register(p("/a"))],
        ),
    ];
    for (name, found, registered, failed, want) in cases {
        let found = found.into_iter().map(|(k, v)| (p(k), v)).collect();
        let registered = registered.into_iter().map(|(k, v)| (p(k), v)).collect();
        let failed = failed.into_iter().map(|(k, v)| (p(k), v)).collect();
        assert_eq!(reconcile(&found, &registered, &failed, now), want, "{name}");
    }
}

#[test]
fn backoff_doubles_to_the_cap_and_restarts_for_a_new_socket() {
    let now = clock::instant();
    let mut last: Option<Failed> = None;
    let mut waits = Vec::new();
    for _ in 0..12 {
        let wait = next_backoff(last.as_ref(), id(1));
        waits.push(wait.as_millis());
        last = Some(Failed {
            id: id(1),
            until: now + wait,
            wait,
        });
    }
    assert_eq!(&waits[..4], &[500, 1000, 2000, 4000]);
    assert_eq!(*waits.last().unwrap(), 122_000);
    assert_eq!(next_backoff(last.as_ref(), id(2)), BACKOFF_FIRST);
}

/// A plugin's registration server: answers `info`, records the statuses it is told.
struct FakePlugin {
    info: proto::PluginInfo,
    told: Arc<Mutex<Vec<proto::RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for FakePlugin {
    async fn get_info(
        &self,
        _: tonic::Request<proto::InfoRequest>,
    ) -> Result<tonic::Response<proto::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }
    async fn notify_registration_status(
        &self,
        request: tonic::Request<proto::RegistrationStatus>,
    ) -> Result<tonic::Response<proto::RegistrationStatusResponse>, tonic::Status> {
        self.told.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(proto::RegistrationStatusResponse {}))
    }
}

/// A handler that accepts version 1.0.0 only and records what it was given.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
}

impl PluginHandler for Recording {
    fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("validate {name} {endpoint}"));
        if versions.iter().any(|v| v == "1.0.0") {
            Ok(())
        } else {
            Err(HandlerError(format!(
                "none of the versions specified {versions:?} are supported"
            )))
        }
    }
    fn register<'a>(
        &'a self,
        name: &'a str,
        _: &'a str,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(format!("register {name}"));
            Ok(())
        })
    }
    fn deregister<'a>(&'a self, name: &'a str, _: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.calls
                .lock()
                .unwrap()
                .push(format!("deregister {name}"))
        })
    }
}

fn serve(socket: &Path, info: proto::PluginInfo) -> Arc<Mutex<Vec<proto::RegistrationStatus>>> {
    let told = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let server = RegistrationServer::new(FakePlugin {
        info,
        told: told.clone(),
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    told
}

fn info(kind: &str, version: &str) -> proto::PluginInfo {
    proto::PluginInfo {
        r#type: kind.into(),
        name: "mock.csi".into(),
        endpoint: "/run/mock.sock".into(),
        supported_versions: vec![version.into()],
    }
}

#[tokio::test]
async fn registers_through_the_handler_of_its_type_and_tells_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mock-reg.sock");
    let told = serve(&socket, info(CSI_PLUGIN, "1.0.0"));
    let handler = Arc::new(Recording::default());
    let handlers: Handlers = [(
        CSI_PLUGIN.to_string(),
        handler.clone() as Arc<dyn PluginHandler>,
    )]
    .into();
    let found = scan(dir.path());
    let got = register(&socket, found[&socket], &handlers).await.unwrap();
    assert_eq!(
        (got.name.as_str(), got.endpoint.as_str()),
        ("mock.csi", "/run/mock.sock")
    );
    assert_eq!(
        *handler.calls.lock().unwrap(),
        ["validate mock.csi /run/mock.sock", "register mock.csi"]
    );
    let told = told.lock().unwrap();
    assert_eq!(told.len(), 1);
    assert!(told[0].plugin_registered, "{:?}", told[0]);
}

#[tokio::test]
async fn refusals_are_told_in_upstreams_words() {
    let dir = tempfile::tempdir().unwrap();
    let handlers: Handlers = [(
        CSI_PLUGIN.to_string(),
        Arc::new(Recording::default()) as Arc<dyn PluginHandler>,
    )]
    .into();
    let cases = [
        (
            info("DRAPlugin", "1.0.0"),
            format!("RegisterPlugin error -- no handler registered for plugin type: DRAPlugin at socket {}/s0.sock", dir.path().display()),
        ),
        (
            info(CSI_PLUGIN, "0.3.0"),
            "RegisterPlugin error -- plugin validation failed with err: none of the versions specified [\"0.3.0\"] are supported".to_string(),
        ),
    ];
    for (n, (info, want)) in cases.into_iter().enumerate() {
        let socket = dir.path().join(format!("s{n}.sock"));
        let told = serve(&socket, info);
        let err = register(&socket, id(1), &handlers).await.unwrap_err();
        assert_eq!(err.to_string(), want);
        let told = told.lock().unwrap();
        assert_eq!(
            (told[0].plugin_registered, told[0].error.as_str()),
            (false, want.as_str())
        );
    }
}

#[test]
fn scan_finds_sockets_below_the_registry_and_skips_hidden_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let _a = std::os::unix::net::UnixListener::bind(dir.path().join("a.sock")).unwrap();
    let _b = std::os::unix::net::UnixListener::bind(dir.path().join("sub/b.sock")).unwrap();
    let _h = std::os::unix::net::UnixListener::bind(dir.path().join(".hidden.sock")).unwrap();
    std::fs::write(dir.path().join("file"), "").unwrap();
    let found: Vec<PathBuf> = scan(dir.path()).into_keys().collect();
    assert_eq!(
        found,
        [dir.path().join("a.sock"), dir.path().join("sub/b.sock")]
    );
}
