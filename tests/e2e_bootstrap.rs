//! End to end, against the real test control plane (`scripts/cluster`): a node that has only
//! a bootstrap token gets its own client certificate by TLS bootstrap (a CSR the
//! controller-manager approves and signs), and renews it while its pods keep running.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{
    NodeCleanup, admin, cluster_cmd, cluster_dir, create_namespace, get_lease, wait_node_ready,
};
use common::{Agent, wait_until};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// Deletes the node's CSRs when dropped (they are cluster-scoped and outlive the test).
struct CsrCleanup(String);

impl Drop for CsrCleanup {
    fn drop(&mut self) {
        let node = self.0.clone();
        common::cluster::clean_up_with_admin(move |client| async move {
            let api: Api<CertificateSigningRequest> = Api::all(client);
            for csr in node_csrs(&api, &node).await {
                if let Some(name) = csr.metadata.name {
                    let _ = api.delete(&name, &DeleteParams::default()).await;
                }
            }
        });
    }
}

/// The kubelet client CSRs whose request names `system:node:<node>`, oldest first.
async fn node_csrs(
    api: &Api<CertificateSigningRequest>,
    node: &str,
) -> Vec<CertificateSigningRequest> {
    let want = format!("system:node:{node}");
    let mut csrs: Vec<_> = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.spec.signer_name == deckhand::kubelet::certificate::csr::SIGNER_NAME
                && deckhand::kubelet::certificate::csr::csr_common_name(&c.spec.request.0)
                    .as_deref()
                    == Some(want.as_str())
        })
        .collect();
    csrs.sort_by_key(|c| c.metadata.creation_timestamp.clone().map(|t| t.0));
    csrs
}

fn approved_and_signed(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    let approved = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == "Approved" && c.status == "True")
    });
    approved
        && status
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty())
}

/// An agent for `node` with only a bootstrap kubeconfig: `--kubeconfig` names a file that
/// does not exist yet; the cert dir is the default (`<root-dir>/pki`).
fn bootstrapping_agent(node: &str) -> (Agent, NodeCleanup, CsrCleanup, PathBuf) {
    let cleanup = NodeCleanup(node.to_string());
    let csrs = CsrCleanup(node.to_string());
    let mut agent = Agent::new(node);
    let boot = agent.dir.path().join("bootstrap.kubeconfig");
    cluster_cmd(&[
        "bootstrap-kubeconfig",
        &cluster_dir().to_string_lossy(),
        &boot.to_string_lossy(),
    ]);
    let kubeconfig = agent.dir.path().join("kubelet.kubeconfig");
    let config = agent.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeLeaseDurationSeconds: 8\n",
    )
    .unwrap();
    agent.extra_args.extend([
        format!("--bootstrap-kubeconfig={}", boot.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", config.display()),
    ]);
    (agent, cleanup, csrs, kubeconfig)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The stored certificates (not the link) in the cert dir, sorted.
fn stored(pki: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(pki)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| deckhand::kubelet::certificate::store::is_stored_name(n))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn link_target(pki: &Path) -> PathBuf {
    std::fs::read_link(pki.join("kubelet-client-current.pem")).expect("the current link")
}

/// Waits until the Lease's renewTime moves past what it is now.
async fn lease_renewed(client: &kube::Client, node: &str) {
    let before = get_lease(client, node)
        .await
        .and_then(|l| l.spec?.renew_time)
        .map(|t| t.0);
    wait_until("the Lease renewed", Duration::from_secs(10), || async {
        let now = get_lease(client, node).await?.spec?.renew_time?.0;
        (Some(now) > before).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_node_joins_with_only_a_bootstrap_token() {
    let node = "db-join";
    let client = admin().await;
    let csr_api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let (mut agent, _node_cleanup, _csr_cleanup, kubeconfig) = bootstrapping_agent(node);
    assert!(!kubeconfig.exists());
    let started = Instant::now();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    eprintln!(
        "start → Node Ready through TLS bootstrap: {:?}",
        started.elapsed()
    );

    // The files: a timestamped certificate (0600), the link to it, the kubeconfig naming it.
    let pki = agent.root_dir().join("pki");
    let files = stored(&pki);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(link_target(&pki), pki.join(&files[0]));
    assert_eq!(mode(&pki.join(&files[0])), 0o600);
    assert_eq!(mode(&kubeconfig), 0o600);
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        text.contains(
            &pki.join("kubelet-client-current.pem")
                .to_string_lossy()
                .into_owned()
        ),
        "{text}"
    );
    let creds = deckhand::kubelet::certificate::Credentials::from_pem(
        &std::fs::read(pki.join(&files[0])).unwrap(),
    )
    .unwrap();
    assert!(
        creds.subject.contains("CN=system:node:db-join"),
        "{}",
        creds.subject
    );
    assert!(
        creds.subject.contains("O=system:nodes"),
        "{}",
        creds.subject
    );

    // One CSR, made by the bootstrap token's user, approved and signed.
    let csrs = node_csrs(&csr_api, node).await;
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    assert!(
        csrs[0]
            .spec
            .username
            .as_deref()
            .unwrap_or("")
            .starts_with("system:bootstrap:"),
        "{:?}",
        csrs[0].spec.username
    );
    assert!(approved_and_signed(&csrs[0]));

    // The node works as itself: its Lease is renewed.
    lease_renewed(&client, node).await;

    // A restart uses the kubeconfig it wrote: no new CSR.
    agent.stop();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    lease_renewed(&client, node).await;
    assert_eq!(node_csrs(&csr_api, node).await.len(), 1);
    assert_eq!(stored(&pki), files);
    assert!(
        agent
            .log()
            .contains("holds a valid client certificate; no TLS bootstrap"),
        "{}",
        agent.log()
    );
}

#[tokio::test]
async fn the_client_certificate_is_rotated_while_a_pod_runs() {
    let node = "db-rotate";
    let client = admin().await;
    let csr_api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let (mut agent, _node_cleanup, _csr_cleanup, _kubeconfig) = bootstrapping_agent(node);
    // The cluster signs for a year: rotate 20 s after each certificate is taken into use.
    agent
        .env
        .push(("DECKHAND_TEST_CERT_ROTATE_AFTER".into(), "20s".into()));
    agent.start();
    let started = Instant::now();
    wait_node_ready(&client, node, &agent).await;

    let _ns = create_namespace(&client, "db-rotate").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "db-rotate");
    pods.create(
        &PostParams::default(),
        &common::cluster::bound_pod("sleeper", node),
    )
    .await
    .unwrap();
    let container_id = |p: &Pod| {
        let s = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        s.state.as_ref()?.running.as_ref()?;
        Some((s.container_id?, s.restart_count))
    };
    let (id, restarts) = wait_until("the pod running", Duration::from_secs(30), || async {
        container_id(&pods.get("sleeper").await.ok()?)
    })
    .await;
    assert_eq!(restarts, 0);

    let pki = agent.root_dir().join("pki");
    let first = link_target(&pki);
    // The renewal: a second CSR, made by the node itself, approved and signed; a new file,
    // the link moved.
    let renewal = wait_until(
        "a renewal CSR approved and signed",
        Duration::from_secs(45),
        || async {
            let csrs = node_csrs(&csr_api, node).await;
            (csrs.len() >= 2 && approved_and_signed(&csrs[1])).then(|| csrs[1].clone())
        },
    )
    .await;
    eprintln!("start → certificate rotated: {:?}", started.elapsed());
    assert_eq!(
        renewal.spec.username.as_deref(),
        Some("system:node:db-rotate"),
        "the node renews with its own certificate"
    );
    wait_until("the link moved", Duration::from_secs(10), || async {
        (stored(&pki).len() >= 2 && link_target(&pki) != first).then_some(())
    })
    .await;
    assert!(
        agent.log().contains("rotated the client certificate"),
        "{}",
        agent.log()
    );

    // Nothing else moved: the Lease is renewed after the rotation, and the pod's container
    // is the same and never restarted.
    lease_renewed(&client, node).await;
    lease_renewed(&client, node).await;
    let pod = pods.get("sleeper").await.unwrap();
    assert_eq!(container_id(&pod), Some((id, 0)));

    // The pod watch opened before the rotation still delivers: a label change made now
    // reaches the agent.
    let updates = |log: &str| log.matches(r#"op="update" pod=db-rotate/sleeper"#).count();
    let before = updates(&agent.log());
    pods.patch(
        "sleeper",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"rotated": "yes"}}})),
    )
    .await
    .unwrap();
    wait_until(
        "the label change seen by the agent",
        Duration::from_secs(10),
        || async { (updates(&agent.log()) > before).then_some(()) },
    )
    .await;
    eprintln!("rotation test total: {:?}", started.elapsed());
}
