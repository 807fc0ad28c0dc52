//! GPU fabric measurements (NCCL sweep, GPU-pair copies, DDP probe, NVML health) behind a cuda and a sim backend; no Kubernetes.
