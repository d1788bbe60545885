//! A container's port as a probe or lifecycle hook names it: a number, or the name of one of
//! the container's ports. The prober and the hooks both ask.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A probe's or hook's port cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PortError {
    #[error("couldn't find port {0:?} in the container's ports")]
    NoSuchName(String),
    #[error("invalid port number: {0}")]
    OutOfRange(i32),
}

/// A probe's port: a number, or the name of one of the container's ports (or a number written
/// as a string).
pub(crate) fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, PortError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port);
            match named {
                Some(n) => n,
                None => name
                    .parse::<i32>()
                    .map_err(|_| PortError::NoSuchName(name.clone()))?,
            }
        }
    };
    match u16::try_from(number) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(PortError::OutOfRange(number)),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerPort;

    use super::*;

    #[test]
    fn ports_resolve_by_number_name_or_numeric_string() {
        let c = Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
        assert!(
            resolve_port(&IntOrString::String("grpc".into()), &c)
                .unwrap_err()
                .to_string()
                .contains("\"grpc\"")
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(0), &c).map_err(|e| e.to_string()),
            Err("invalid port number: 0".into())
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(70000), &c),
            Err(PortError::OutOfRange(70000))
        );
    }
}
