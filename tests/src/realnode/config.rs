//! The configuration files of a real node, built with no I/O: containerd's `config.toml`,
//! the CNI network, and the kubelet's and kube-proxy's configuration documents.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Where everything of one node lives, under its own directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd.toml")
    }
    pub fn containerd_root(&self) -> PathBuf {
        self.dir.join("containerd/root")
    }
    pub fn containerd_state(&self) -> PathBuf {
        self.dir.join("containerd/state")
    }
    /// runc's state (by default `/run/containerd/runc`).
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("containerd/runc")
    }
    /// containerd's `opt` plugin directory (by default `/opt/containerd`).
    pub fn containerd_opt(&self) -> PathBuf {
        self.dir.join("containerd/opt")
    }
    /// containerd's registry hosts (`certs.d/<host>/hosts.toml`, by default
    /// `/etc/containerd/certs.d`), read at each pull.
    pub fn registry_hosts(&self) -> PathBuf {
        self.dir.join("containerd/certs.d")
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    /// host-local's address allocations (by default `/var/lib/cni/networks`).
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.join("cni/ipam")
    }
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    /// The CDI specs containerd reads (by default `/etc/cdi` and `/var/run/cdi`), written by
    /// the DRA plugin.
    pub fn cdi_specs(&self) -> PathBuf {
        self.dir.join("cdi")
    }
    pub fn kubelet_config(&self) -> PathBuf {
        self.dir.join("kubelet.yaml")
    }
    pub fn kube_proxy_config(&self) -> PathBuf {
        self.dir.join("kube-proxy.yaml")
    }
    /// Container logs (by default `/var/log/pods`).
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
    /// Flexvolume plugins (by default `/usr/libexec/kubernetes/...`, created at start).
    pub fn volume_plugins(&self) -> PathBuf {
        self.dir.join("volume-plugins")
    }
    pub fn images(&self) -> PathBuf {
        self.dir.join("images")
    }
    pub fn certs(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub fn kubeconfig(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.kubeconfig"))
    }
    pub fn log(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }
}

/// Settings that the files below share.
#[derive(Debug, Clone)]
pub(crate) struct NodeConfig {
    pub name: String,
    pub node_ip: IpAddr,
    pub pod_cidr: String,
    pub bridge: String,
    pub cni_bin_dir: PathBuf,
    pub pause_image: String,
    /// The kubelet's cgroup parent of every pod (a directory in each cgroup hierarchy).
    pub cgroup_root: String,
    pub kubelet_port: u16,
    pub kube_proxy_healthz_port: u16,
    pub kube_proxy_metrics_port: u16,
    pub ca_cert: PathBuf,
    /// containerd injects CDI devices (a DRA claim's) from specs in [`Layout::cdi_specs`];
    /// needs containerd 1.7.
    pub cdi: bool,
}

fn toml_str(p: &Path) -> String {
    // Paths of temp dirs hold no quotes or backslashes; escape them anyway.
    format!(
        "\"{}\"",
        p.display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    )
}

/// containerd's configuration: its own root, state, socket, runc state and `opt` dir under
/// the node's directory, the CRI plugin with a local pause image, the node's CNI network,
/// runc with cgroupfs and `restrict_oom_score_adj` (root without CAP_SYS_RESOURCE cannot
/// lower a sandbox's `oom_score_adj`: every sandbox failed without it), and network
/// namespaces under the state dir (not `/var/run/netns`), so that teardown finds them.
pub(crate) fn containerd_toml(layout: &Layout, node: &NodeConfig) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"# Written by the gpufabric test harness (tests/src/realnode).
version = 2
root = {root}
state = {state}
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = {socket}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
{cdi}
[{cri}.registry]
  config_path = {registry_hosts}

[{cri}.cni]
  bin_dir = {cni_bin}
  conf_dir = {cni_conf}
  max_conf_num = 1

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = {runc_root}
"#,
        root = toml_str(&layout.containerd_root()),
        state = toml_str(&layout.containerd_state()),
        socket = toml_str(&layout.containerd_socket()),
        opt = toml_str(&layout.containerd_opt()),
        pause = node.pause_image,
        cni_bin = toml_str(&node.cni_bin_dir),
        cni_conf = toml_str(&layout.cni_conf_dir()),
        runc_root = toml_str(&layout.runc_root()),
        registry_hosts = toml_str(&layout.registry_hosts()),
        cdi = if node.cdi {
            format!(
                "  enable_cdi = true\n  cdi_spec_dirs = [{}]\n",
                toml_str(&layout.cdi_specs())
            )
        } else {
            String::new()
        },
    )
}

/// containerd's `hosts.toml` for a registry at `host` (`127.0.0.1:PORT`) served over TLS
/// with a certificate from `ca`.
pub(crate) fn registry_hosts_toml(host: &str, ca: &Path) -> String {
    format!(
        r#"# Written by the gpufabric test harness (tests/src/realnode).
server = "https://{host}"

[host."https://{host}"]
  capabilities = ["pull", "resolve"]
  ca = {ca}
"#,
        ca = toml_str(ca),
    )
}

/// Name of the CNI network (it appears in the comments of the rules its plugins write).
pub(crate) const CNI_NETWORK: &str = "gpufabric";

/// The pods' network: a bridge (the node's gateway, `hairpinMode` so a pod reaches itself
/// through a Service) with host-local addresses from the pod CIDR, and portmap for
/// `hostPort`. No masquerading: pods reach the host (and through it the API server) and
/// each other, and nothing outside, so there are no per-pod NAT rules to clean up.
/// containerd adds the loopback interface itself (its `loopback` plugin, from the same
/// bin dir).
pub(crate) fn cni_conflist(layout: &Layout, node: &NodeConfig) -> String {
    let doc = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": layout.ipam_dir(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false},
        ],
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
}

/// The kubelet's configuration (`KubeletConfiguration`, v1beta1).
///
/// Notable settings, each needed on these machines or for a test node:
/// - `cgroupDriver: cgroupfs` and `failCgroupV1: false`: the hosts run cgroup v1, which
///   kubelet 1.33 still runs on (with a `CgroupV1` warning event on the Node) unless
///   `failCgroupV1` is true; v1.35 turns that default around, so it is set explicitly.
/// - `cgroupRoot`: every pod's cgroup under one directory, which teardown empties;
/// - `makeIPTablesUtilChains: false`: the kubelet's own iptables chains are not needed
///   (kube-proxy makes the ones it needs), so there are fewer to remove;
/// - authentication by client certificate from the cluster's CA (the API server presents
///   one), anonymous off, `AlwaysAllow` authorization: a test node;
/// - the API server reaches the kubelet (logs) at the node's address, on a free port;
/// - no image garbage collection and near-zero eviction thresholds, so imported images
///   stay and a full disk does not evict the test's pods;
/// - `podLogsDir` and `volumePluginDir` under the node's directory.
pub(crate) fn kubelet_config(layout: &Layout, node: &NodeConfig) -> String {
    let socket = format!("unix://{}", layout.containerd_socket().display());
    let doc = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.node_ip.to_string(),
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "containerRuntimeEndpoint": socket,
        "imageServiceEndpoint": socket,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": false,
        "cgroupsPerQOS": true,
        "cgroupRoot": format!("/{}", node.cgroup_root),
        "enforceNodeAllocatable": [],
        "failSwapOn": false,
        "makeIPTablesUtilChains": false,
        "protectKernelDefaults": false,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": node.ca_cert},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [],
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": layout.pod_logs(),
        "volumePluginDir": layout.volume_plugins(),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": false,
        "rotateCertificates": false,
        "serverTLSBootstrap": false,
        "registerNode": true,
        "nodeStatusUpdateFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
}

/// kube-proxy's configuration (`KubeProxyConfiguration`, v1alpha1): iptables mode, the pod
/// CIDR as the cluster's (traffic to a Service from outside it is masqueraded), and
/// nothing that changes the host beyond its own chains: no NodePorts on localhost (which
/// would set `route_localnet`), no conntrack table sizes or timeouts.
pub(crate) fn kube_proxy_config(layout: &Layout, node: &NodeConfig) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": layout.kubeconfig("kube-proxy")},
        "mode": "iptables",
        "clusterCIDR": node.pod_cidr,
        "hostnameOverride": node.name,
        "bindAddress": node.node_ip.to_string(),
        "healthzBindAddress": format!("127.0.0.1:{}", node.kube_proxy_healthz_port),
        "metricsBindAddress": format!("127.0.0.1:{}", node.kube_proxy_metrics_port),
        "nodePortAddresses": [format!("{}/32", node.node_ip)],
        "iptables": {"localhostNodePorts": false, "masqueradeAll": false, "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Layout, NodeConfig) {
        let layout = Layout {
            dir: PathBuf::from("/tmp/gpufabric-realnode-x"),
        };
        let node = NodeConfig {
            name: "n1".into(),
            node_ip: "192.0.2.2".parse().unwrap(),
            pod_cidr: "10.244.0.0/24".into(),
            bridge: "gpufabric0".into(),
            cni_bin_dir: "/usr/lib/cni".into(),
            pause_image: "docker.io/local/pause:1".into(),
            cgroup_root: "gpufabric-realnode".into(),
            kubelet_port: 10250,
            kube_proxy_healthz_port: 10256,
            kube_proxy_metrics_port: 10249,
            ca_cert: "/tmp/ca.crt".into(),
            cdi: false,
        };
        (layout, node)
    }

    #[test]
    fn containerd_keeps_all_its_state_under_the_node_dir() {
        let (layout, node) = sample();
        let toml = containerd_toml(&layout, &node);
        for line in toml.lines().filter(|l| l.contains("\"/")) {
            assert!(
                line.contains("/tmp/gpufabric-realnode-x/") || line.contains("/usr/lib/cni"),
                "{line}"
            );
        }
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains("netns_mounts_under_state_dir = true"));
        assert!(toml.contains("sandbox_image = \"docker.io/local/pause:1\""));
        assert!(toml.contains("config_path = \"/tmp/gpufabric-realnode-x/containerd/certs.d\""));
    }

    #[test]
    fn containerd_reads_cdi_specs_from_the_node_dir_only_in_dra_mode() {
        let (layout, mut node) = sample();
        assert!(!containerd_toml(&layout, &node).contains("cdi"));
        node.cdi = true;
        let toml = containerd_toml(&layout, &node);
        assert!(toml.contains("enable_cdi = true"), "{toml}");
        assert!(
            toml.contains("cdi_spec_dirs = [\"/tmp/gpufabric-realnode-x/cdi\"]"),
            "{toml}"
        );
    }

    #[test]
    fn a_registry_is_reached_over_tls_trusting_its_own_ca() {
        let hosts = registry_hosts_toml("127.0.0.1:5000", Path::new("/tmp/r/certs/ca.crt"));
        assert!(hosts.contains("server = \"https://127.0.0.1:5000\""));
        assert!(hosts.contains("[host.\"https://127.0.0.1:5000\"]"));
        assert!(hosts.contains("ca = \"/tmp/r/certs/ca.crt\""));
    }

    #[test]
    fn kubelet_runs_on_cgroup_v1_with_cgroupfs() {
        let (layout, node) = sample();
        let cfg: serde_json::Value = serde_json::from_str(&kubelet_config(&layout, &node)).unwrap();
        assert_eq!(cfg["cgroupDriver"], "cgroupfs");
        assert_eq!(cfg["failCgroupV1"], false);
        assert_eq!(cfg["cgroupRoot"], "/gpufabric-realnode");
        assert_eq!(cfg["address"], "192.0.2.2");
        assert_eq!(
            cfg["containerRuntimeEndpoint"],
            "unix:///tmp/gpufabric-realnode-x/containerd.sock"
        );
    }

    #[test]
    fn pod_network_is_a_bridge_without_masquerading() {
        let (layout, node) = sample();
        let cni: serde_json::Value = serde_json::from_str(&cni_conflist(&layout, &node)).unwrap();
        assert_eq!(cni["plugins"][0]["type"], "bridge");
        assert_eq!(cni["plugins"][0]["bridge"], "gpufabric0");
        assert_eq!(cni["plugins"][0]["ipMasq"], false);
        assert_eq!(
            cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.0.0/24"
        );
        assert_eq!(cni["plugins"][1]["type"], "portmap");
    }
}
