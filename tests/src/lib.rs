//! Test support: a real local control plane (etcd, kube-apiserver, controller-manager), a process-kubelet and simulated GPU nodes.
