//! End to end: the commands for people. `deckhand pods` against a running agent on the private
//! containerd says in one line why each broken pod is not running; `deckhand validate` reports
//! manifest problems with file, line and column and an exit code; `deckhand version`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::{Agent, BUSYBOX, deckhand_bin, sleeping_pod, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Runs `deckhand ARGS…`; exit code, stdout, stderr.
fn deckhand(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(deckhand_bin())
        .args(args)
        .output()
        .expect("run deckhand");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn deckhand_pods_says_in_one_line_why_a_pod_is_not_running() {
    let mut agent = Agent::new("e2e-cli-pods");
    agent.backoff("1s", "2s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("ok.yaml", &sleeping_pod("ok"));
    agent.write_manifest(
        "broken.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "echo bad config >&2; exit 3"]}}
"#
        ),
    );
    agent.write_manifest(
        "nopull.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: nopull}
spec:
  containers:
  - {name: app, image: "localhost/deckhand/absent:0.0", imagePullPolicy: Never}
"#,
    );
    agent.write_manifest(
        "unready.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: unready}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
    readinessProbe:
      exec:
        command: ["sh", "-c", "echo not yet; exit 1"]
      periodSeconds: 1
"#
        ),
    );

    agent.write_manifest(
        "elsewhere.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: elsewhere}}
spec:
  nodeSelector: {{disk: ssd}}
  containers:
  - {{name: app, image: {BUSYBOX}}}
"#
        ),
    );

    let root = agent.root_dir().display().to_string();
    let socket = agent.root_dir().join("deckhand.sock");
    let mode = std::fs::metadata(&socket)
        .expect("the local socket exists once the agent is healthy")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the local socket is for its owner only"
    );

    let names = ["ok", "crash", "nopull", "unready", "elsewhere"].map(|n| agent.pod_name(n));
    let rows: Vec<Value> = wait_until("deckhand pods to explain every broken pod", WAIT, || {
        let root = root.clone();
        let names = names.clone();
        async move {
            let (code, out, _) = deckhand(&["pods", "-o", "json", "--root-dir", &root]);
            if code != 0 {
                return None;
            }
            let rows: Vec<Value> = serde_json::from_str(&out).ok()?;
            let why = |name: &str| -> Option<String> {
                rows.iter()
                    .find(|r| r["name"] == name)
                    .map(|r| r["why"].as_str().unwrap_or_default().to_string())
            };
            let ok = why(&names[0])?.is_empty()
                && rows
                    .iter()
                    .any(|r| r["name"] == names[0].as_str() && r["status"] == "Running");
            let crash = why(&names[1])?.contains("last exit code 3 (Error)");
            let nopull = why(&names[2])?.contains("ErrImageNeverPull");
            let unready = why(&names[3])?.contains("Readiness probe failed");
            let refused = why(&names[4])?
                .starts_with("NodeAffinity: Pod was rejected: Predicate NodeAffinity failed");
            (ok && crash && nopull && unready && refused).then_some(rows)
        }
    })
    .await;
    let crash = rows
        .iter()
        .find(|r| r["name"] == names[1].as_str())
        .unwrap();
    assert!(
        crash["why"]
            .as_str()
            .unwrap()
            .starts_with("container app: "),
        "{crash}"
    );
    let unready = rows
        .iter()
        .find(|r| r["name"] == names[3].as_str())
        .unwrap();
    assert!(
        unready["why"].as_str().unwrap().contains("not yet"),
        "the probe's own output is shown: {unready}"
    );

    // The table for people: a header, one line per pod, the reason on the broken pod's line.
    let (code, table, err) = deckhand(&["pods", "--root-dir", &root]);
    assert_eq!(code, 0, "{err}");
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("NAMESPACE") && header.ends_with("WHY"),
        "{table}"
    );
    let nopull_line = table
        .lines()
        .find(|l| l.contains(&names[2]))
        .expect("a line for the pod that cannot pull");
    assert!(nopull_line.contains("ErrImageNeverPull"), "{table}");

    // Nothing listening: one clear line and a failing exit code.
    let (code, _, err) = deckhand(&["pods", "--socket", "/nonexistent/deckhand.sock"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the agent at /nonexistent/deckhand.sock"),
        "{err}"
    );
}

#[test]
fn deckhand_validate_reports_file_line_and_column_and_fails_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&good, sleeping_pod("web")).unwrap();
    std::fs::write(
        &bad,
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    imagePullPolicy: Sometimes
    imagePullPolcy: Always
"#
        ),
    )
    .unwrap();
    let (good, bad) = (good.display().to_string(), bad.display().to_string());

    let (code, out, err) = deckhand(&["validate", "--hostname-override", "n1", &good]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, format!("{good}: ok (web-n1)\n"));

    let (code, out, _) = deckhand(&["validate", "--hostname-override", "n1", &good, &bad]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "{bad}:9:5: error: spec.containers[0].imagePullPolicy: "
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{bad}:10:5: warning: spec.containers[0].imagePullPolcy: unknown field"
        )),
        "{out}"
    );

    let (code, out, _) = deckhand(&["validate", "-o", "json", &bad, "/nonexistent.yaml"]);
    assert_eq!(code, 1);
    let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(reports[0]["ok"], false);
    assert_eq!(reports[0]["diagnostics"][0]["line"], 9);
    assert_eq!(reports[0]["diagnostics"][0]["column"], 5);
    assert_eq!(reports[1]["ok"], false);
    assert!(
        reports[1]["diagnostics"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read the file"),
        "{out}"
    );

    let (code, _, err) = deckhand(&["validate"]);
    assert_eq!(code, 2, "a usage error: {err}");
}

/// Every manifest of `tests/manifests/bad` names its mistake's place on its first line
/// (`# expect: LINE:COLUMN [FIELD]`); validate must point there.
#[test]
fn deckhand_validate_points_at_each_mistake_of_the_bad_manifest_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/manifests/bad");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "the corpus is in {}", dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: no `# expect:` line", file.display()));
        let (place, field) = expect.split_once(' ').unwrap_or((expect, ""));
        let path = file.display().to_string();
        let (code, out, err) = deckhand(&["validate", "--hostname-override", "n1", &path]);
        assert_eq!(code, 1, "{path}: {out}{err}");
        let mut want = format!("{path}:{place}: error: ");
        if !field.is_empty() {
            want.push_str(&format!("{field}: "));
        }
        assert!(
            out.lines().next().is_some_and(|l| l.starts_with(&want)),
            "{path}: want a first finding starting {want:?}, got:\n{out}"
        );
    }
}

#[test]
fn deckhand_version_names_itself_and_its_api_level() {
    let (code, out, _) = deckhand(&["version", "-o", "json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["deckhand"], env!("CARGO_PKG_VERSION"));
    assert!(
        v["kubeletVersion"]
            .as_str()
            .unwrap()
            .starts_with("v1.37.0+deckhand-")
    );
    let (code, out, _) = deckhand(&["version"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&format!("deckhand {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
}
