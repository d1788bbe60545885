//! The hardening section: the settings that narrow what a pod or a client of the node API may
//! do, and what the kernel must look like, with upstream's names and defaults:
//! `seccompDefault` (`--seccomp-default`), `enableDebuggingHandlers`
//! (`--enable-debugging-handlers`), `enableSystemLogHandler` (file only, as upstream) and
//! `protectKernelDefaults` (`--protect-kernel-defaults`).
//!
//! They were once unknown fields, warned about and ignored: a node the operator meant to lock
//! down ran pods `Unconfined` and served exec. Each is now applied as upstream applies it, and
//! never dropped: a value that cannot be read stops the start naming the field.

use clap::Args;

use super::ConfigError;
use super::file::KubeletConfigurationFile;
use super::flags::parse_go_bool;
use super::validate::pick;

/// The hardening flags (flattened into [`super::Flags`]).
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct HardeningFlags {
    /// Give every container (and sandbox) whose pod sets no seccomp profile the runtime's
    /// default profile, `RuntimeDefault`, instead of `Unconfined` (seccompDefault).
    /// [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub seccomp_default: Option<bool>,

    /// Serve exec, attach, port-forward, run, container logs, `/runningpods/`, `/configz` and
    /// `/logs/` on the node API (enableDebuggingHandlers); false answers them 405
    /// "Debug endpoints are disabled.". [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub enable_debugging_handlers: Option<bool>,

    /// Refuse to start when a kernel setting upstream's kubelet tunes (vm.overcommit_memory,
    /// vm.panic_on_oom, kernel.panic, kernel.panic_on_oops, kernel.keys.root_maxkeys,
    /// kernel.keys.root_maxbytes) differs from its value (protectKernelDefaults).
    /// [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool)]
    pub protect_kernel_defaults: Option<bool>,
}

/// The merged hardening settings. `Default` is upstream's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardeningSettings {
    /// `seccompDefault`: `RuntimeDefault` for pods and containers that set no profile.
    pub seccomp_default: bool,
    /// `enableDebuggingHandlers`: the node API serves exec, attach, port-forward, logs, ...
    pub debugging_handlers: bool,
    /// `enableSystemLogHandler`: the node API serves `/logs/` (only with the debugging
    /// handlers, as upstream).
    pub system_log_handler: bool,
    /// `protectKernelDefaults`: the kernel's tunables are checked at start, not left alone.
    pub protect_kernel_defaults: bool,
}

impl Default for HardeningSettings {
    fn default() -> Self {
        HardeningSettings {
            seccomp_default: false,
            debugging_handlers: true,
            system_log_handler: true,
            protect_kernel_defaults: false,
        }
    }
}

/// The hardening settings: flag beats file beats upstream's default. Also refuses the
/// security fields of the file that Deckhand cannot follow (see [`refuse_unfollowed`]).
pub(super) fn hardening_settings(
    flags: &HardeningFlags,
    f: &KubeletConfigurationFile,
) -> Result<HardeningSettings, ConfigError> {
    let defaults = HardeningSettings::default();
    let (seccomp_default, _) = pick(
        flags.seccomp_default,
        "--seccomp-default",
        f.seccomp_default,
        "seccompDefault",
        || defaults.seccomp_default,
    );
    let (debugging_handlers, _) = pick(
        flags.enable_debugging_handlers,
        "--enable-debugging-handlers",
        f.enable_debugging_handlers,
        "enableDebuggingHandlers",
        || defaults.debugging_handlers,
    );
    let (protect_kernel_defaults, _) = pick(
        flags.protect_kernel_defaults,
        "--protect-kernel-defaults",
        f.protect_kernel_defaults,
        "protectKernelDefaults",
        || defaults.protect_kernel_defaults,
    );
    refuse_unfollowed(f)?;
    Ok(HardeningSettings {
        seccomp_default,
        debugging_handlers,
        system_log_handler: f
            .enable_system_log_handler
            .unwrap_or(defaults.system_log_handler),
        protect_kernel_defaults,
    })
}

/// The only `imagePullCredentialsVerificationPolicy` Deckhand follows: an image on the node may
/// be used by any pod, whoever pulled it, with whatever credentials.
pub(crate) const NEVER_VERIFY: &str = "NeverVerify";

/// Security fields the file may set that Deckhand cannot follow: rather than start with a
/// weaker setting than the operator asked for, the start stops naming the field.
///
/// - `tlsCurvePreferences`: the node API offers rustls's groups (X25519, P-256, P-384) and
///   cannot narrow them; an empty list (Go's defaults) is accepted.
/// - `imagePullCredentialsVerificationPolicy`: Deckhand never re-checks a pod's pull
///   credentials for an image already on the node, which is `NeverVerify`; any other policy
///   asks for checks it does not make.
fn refuse_unfollowed(f: &KubeletConfigurationFile) -> Result<(), ConfigError> {
    if let Some(curves) = f.tls_curve_preferences.as_deref()
        && !curves.is_empty()
    {
        return Err(ConfigError::invalid(
            "tlsCurvePreferences",
            format!(
                "{curves:?}: Deckhand cannot restrict the node API's key exchange groups \
                 (it offers X25519, P-256 and P-384); remove the field"
            ),
        ));
    }
    if let Some(policy) = f.image_pull_credentials_verification_policy.as_deref()
        && !policy.is_empty()
        && policy != NEVER_VERIFY
    {
        return Err(ConfigError::invalid(
            "imagePullCredentialsVerificationPolicy",
            format!(
                "{policy:?}: Deckhand does not verify pull credentials for images already on \
                 the node; only {NEVER_VERIFY:?} describes what it does"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;
    use crate::config::{Flags, load_from};

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn load(args: &[&str], body: &str) -> Result<crate::config::Config, ConfigError> {
        let flags = Flags::try_parse_from(std::iter::once("deckhand").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("flags {args:?}: {e}"));
        let text = format!("{HEADER}{body}");
        load_from(
            &flags,
            Some((Path::new("/etc/deckhand/config.yaml"), &text)),
            "node",
        )
    }

    fn settings(
        seccomp_default: bool,
        debugging_handlers: bool,
        system_log_handler: bool,
        protect_kernel_defaults: bool,
    ) -> HardeningSettings {
        HardeningSettings {
            seccomp_default,
            debugging_handlers,
            system_log_handler,
            protect_kernel_defaults,
        }
    }

    /// Each field is read from the file and the flag (where upstream has one), the flag
    /// winning; none of them is reported as an unknown field any more.
    #[test]
    fn each_field_is_applied() {
        let cases: &[(&[&str], &str, HardeningSettings)] = &[
            (&[], "", settings(false, true, true, false)),
            (
                &[],
                "seccompDefault: true\n",
                settings(true, true, true, false),
            ),
            (
                &["--seccomp-default"],
                "",
                settings(true, true, true, false),
            ),
            (
                &["--seccomp-default=false"],
                "seccompDefault: true\n",
                settings(false, true, true, false),
            ),
            (
                &[],
                "enableDebuggingHandlers: false\n",
                settings(false, false, true, false),
            ),
            (
                &["--enable-debugging-handlers=false"],
                "enableDebuggingHandlers: true\n",
                settings(false, false, true, false),
            ),
            (
                &[],
                "enableSystemLogHandler: false\n",
                settings(false, true, false, false),
            ),
            (
                &[],
                "protectKernelDefaults: true\n",
                settings(false, true, true, true),
            ),
            (
                &["--protect-kernel-defaults"],
                "",
                settings(false, true, true, true),
            ),
            (
                &[],
                "seccompDefault: true\nenableDebuggingHandlers: false\n\
                 enableSystemLogHandler: false\nprotectKernelDefaults: true\n\
                 tlsCurvePreferences: []\nimagePullCredentialsVerificationPolicy: NeverVerify\n",
                settings(true, false, false, true),
            ),
        ];
        for (args, body, want) in cases {
            let config = load(args, body).unwrap_or_else(|e| panic!("{args:?} {body:?}: {e}"));
            assert_eq!(config.hardening, *want, "{args:?} {body:?}");
            assert_eq!(config.warnings, Vec::<String>::new(), "{args:?} {body:?}");
        }
    }

    /// A security field Deckhand cannot follow, or a value that is not a boolean, stops the
    /// start, and the error names the field.
    #[test]
    fn refusals_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("tlsCurvePreferences: [23, 29]\n", "tlsCurvePreferences"),
            (
                "imagePullCredentialsVerificationPolicy: AlwaysVerify\n",
                "imagePullCredentialsVerificationPolicy",
            ),
            (
                "imagePullCredentialsVerificationPolicy: NeverVerifyPreloadedImages\n",
                "imagePullCredentialsVerificationPolicy",
            ),
            ("seccompDefault: maybe\n", "seccompDefault"),
            ("enableDebuggingHandlers: 0.5\n", "enableDebuggingHandlers"),
            ("enableSystemLogHandler: [true]\n", "enableSystemLogHandler"),
            (
                "protectKernelDefaults: yes please\n",
                "protectKernelDefaults",
            ),
        ];
        for (body, field) in cases {
            let err = load(&[], body).expect_err(body).to_string();
            assert!(err.contains(field), "{body:?}: {err}");
        }
        assert!(Flags::try_parse_from(["deckhand", "--seccomp-default=maybe"]).is_err());
    }
}
