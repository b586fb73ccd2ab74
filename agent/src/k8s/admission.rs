//! Where the ingress-nginx admission webhook is, for ingress-nightmare-mitigation: its Services
//! (in the namespaces ingress-nginx installs to) and their EndpointSlices, as reflectors see them.

use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::ResourceExt;

use crate::policy::{
    Endpoints, INGRESS_ADMISSION_NAMESPACES, INGRESS_ADMISSION_SERVICE, ServiceDestinations,
};

/// The label an EndpointSlice names its Service by.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The admission Services among `services` and where they are reached, from their cluster IPs
/// and `slices`. Objects of the same names in other namespaces are left out. Every endpoint
/// counts, ready or not: a pod starting is reachable soon.
pub fn admission_destinations(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
) -> ServiceDestinations {
    let admission = |namespace: Option<String>, name: &str| {
        name == INGRESS_ADMISSION_SERVICE
            && namespace
                .is_some_and(|namespace| INGRESS_ADMISSION_NAMESPACES.contains(&&*namespace))
    };
    let found: Vec<&Arc<Service>> = services
        .iter()
        .filter(|service| admission(service.namespace(), &service.name_any()))
        .collect();
    let mut destinations = ServiceDestinations::default();
    for service in &found {
        destinations.services.push(format!(
            "{}/{}",
            service.namespace().unwrap_or_default(),
            service.name_any()
        ));
        let spec = service.spec.as_ref();
        let ips = spec.and_then(|spec| {
            spec.cluster_ips
                .clone()
                .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        });
        // A headless Service has the cluster IP "None".
        destinations.cluster_ips.extend(
            ips.into_iter()
                .flatten()
                .filter(|ip| !ip.is_empty() && ip != "None"),
        );
    }
    for slice in slices {
        let service = slice.labels().get(SERVICE_NAME_LABEL);
        let served = found.iter().any(|found| {
            found.namespace() == slice.namespace() && Some(&found.name_any()) == service
        });
        if !served || slice.address_type == "FQDN" {
            continue;
        }
        let mut addresses: Vec<String> = slice
            .endpoints
            .iter()
            .flat_map(|endpoint| endpoint.addresses.iter().cloned())
            .collect();
        addresses.sort();
        addresses.dedup();
        // A port without a number is every port. So is a slice without ports, as vArmor reads
        // it: failing closed (ingress-nginx's slices always name the webhook's port).
        let ports = slice.ports.as_deref().unwrap_or_default();
        let mut ports: Vec<u16> = if ports.iter().any(|port| port.port.is_none()) {
            Vec::new()
        } else {
            ports
                .iter()
                .filter_map(|port| port.port.and_then(|port| u16::try_from(port).ok()))
                .collect()
        };
        ports.sort();
        ports.dedup();
        destinations.endpoints.push(Endpoints { addresses, ports });
    }
    destinations.services.sort();
    destinations.cluster_ips.sort();
    destinations.cluster_ips.dedup();
    destinations.endpoints.sort();
    destinations.endpoints.dedup();
    destinations
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(namespace: &str, name: &str, cluster_ips: &[&str]) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"namespace": namespace, "name": name},
                "spec": {"clusterIP": cluster_ips.first(), "clusterIPs": cluster_ips},
            }))
            .unwrap(),
        )
    }

    fn slice(
        namespace: &str,
        service: &str,
        address_type: &str,
        addresses: &[&str],
        ports: serde_json::Value,
    ) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {
                    "namespace": namespace,
                    "name": format!("{service}-{}", addresses.len()),
                    "labels": {SERVICE_NAME_LABEL: service},
                },
                "addressType": address_type,
                "endpoints": addresses.iter().map(|address| json!({"addresses": [address]})).collect::<Vec<_>>(),
                "ports": ports,
            }))
            .unwrap(),
        )
    }

    const NAME: &str = INGRESS_ADMISSION_SERVICE;

    #[test]
    fn cluster_ips_and_endpoint_ports_of_the_admission_services() {
        let services = [
            service("ingress-nginx", NAME, &["10.96.0.20", "fd00::20"]),
            service("kube-system", NAME, &["10.96.0.21"]),
        ];
        let slices = [
            slice(
                "ingress-nginx",
                NAME,
                "IPv4",
                &["10.244.1.5", "10.244.2.7"],
                json!([{"name": "https-webhook", "port": 8443, "protocol": "TCP"}]),
            ),
            slice(
                "ingress-nginx",
                NAME,
                "IPv6",
                &["fd00:244::5"],
                json!([{"port": 8443}]),
            ),
            // A port without a number: every port.
            slice(
                "kube-system",
                NAME,
                "IPv4",
                &["10.244.3.9"],
                json!([{"name": "any"}]),
            ),
            slice(
                "kube-system",
                NAME,
                "FQDN",
                &["webhook.example"],
                json!([{"port": 8443}]),
            ),
        ];
        let expected = ServiceDestinations {
            services: vec![
                format!("ingress-nginx/{NAME}"),
                format!("kube-system/{NAME}"),
            ],
            cluster_ips: vec!["10.96.0.20".into(), "10.96.0.21".into(), "fd00::20".into()],
            endpoints: vec![
                Endpoints {
                    addresses: vec!["10.244.1.5".into(), "10.244.2.7".into()],
                    ports: vec![8443],
                },
                Endpoints {
                    addresses: vec!["10.244.3.9".into()],
                    ports: vec![],
                },
                Endpoints {
                    addresses: vec!["fd00:244::5".into()],
                    ports: vec![8443],
                },
            ],
        };
        assert_eq!(admission_destinations(&services, &slices), expected);
        // Whatever order the reflectors hold them in.
        let (mut services, mut slices) = (services.to_vec(), slices.to_vec());
        services.reverse();
        slices.reverse();
        assert_eq!(admission_destinations(&services, &slices), expected);
    }

    #[test]
    fn same_names_elsewhere_and_headless_services_add_no_address() {
        let services = [
            service("tenant", NAME, &["10.96.0.99"]),
            service("ingress-nginx", "other", &["10.96.0.98"]),
            service("kube-system", NAME, &["None"]),
        ];
        let slices = [
            slice(
                "tenant",
                NAME,
                "IPv4",
                &["10.244.9.9"],
                json!([{"port": 8443}]),
            ),
            slice(
                "ingress-nginx",
                NAME,
                "IPv4",
                &["10.244.9.8"],
                json!([{"port": 8443}]),
            ),
        ];
        let destinations = admission_destinations(&services, &slices);
        assert_eq!(
            destinations,
            ServiceDestinations {
                services: vec![format!("kube-system/{NAME}")],
                ..ServiceDestinations::default()
            },
            "a slice counts only beside its Service"
        );
        assert_eq!(
            admission_destinations(&[], &slices),
            ServiceDestinations::default()
        );
    }
}
