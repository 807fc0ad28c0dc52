//! The GPUs' NVSwitch fabric state, as NVML's GPU fabric info reports what the fabric
//! manager made of each GPU (Hopper and later; older GPUs and boards without NVSwitches
//! say "not supported").

use nvml_wrapper::Nvml;

/// One GPU's fabric state: NVML's `nvmlGpuFabricState_t`, and the status of a finished
/// registration (`nvmlReturn_t`, 0 for success).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FabricState {
    pub state: u8,
    pub status: u32,
}

/// `nvmlGpuFabricInfo_t` of `nvml.h` (the version-less struct of
/// `nvmlDeviceGetGpuFabricInfo`, NVML 12.2 on).
#[repr(C)]
struct FabricInfo {
    cluster_uuid: [u8; 16],
    status: u32,
    clique_id: u32,
    state: u8,
}

/// The fabric state of `dev`; `None` where this NVML has no such call or it failed.
pub(crate) fn fabric_state(nvml: &Nvml, dev: &nvml_wrapper::Device<'_>) -> Option<FabricState> {
    let f = nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().ok()?;
    let mut info = FabricInfo {
        cluster_uuid: [0; 16],
        status: 0,
        clique_id: 0,
        state: 0,
    };
    // SAFETY: the handle belongs to a live device of this NVML session; the out-pointer is a
    // struct laid out as nvml.h's nvmlGpuFabricInfo_t.
    let r = unsafe { f(dev.handle(), &mut info as *mut FabricInfo as *mut _) };
    (r == 0).then_some(FabricState {
        state: info.state,
        status: info.status,
    })
}

/// One GPU's state in words: NVML's `NVML_GPU_FABRIC_STATE_*` (0 not supported, 1 not
/// started, 2 in progress, 3 completed); a completed registration that failed says its
/// status.
fn words(s: FabricState) -> String {
    match (s.state, s.status) {
        (0, _) => "not supported".into(),
        (1, _) => "not started".into(),
        (2, _) => "in progress".into(),
        (3, 0) => "completed".into(),
        (3, status) => format!("failed (NVML status {status})"),
        (other, _) => format!("unknown state {other}"),
    }
}

/// The node's fabric state in words: the one every GPU is in, else each GPU's
/// (`0: completed, 1: not started`); `None` for no GPUs.
pub(crate) fn fabric_words(states: &[FabricState]) -> Option<String> {
    let first = words(*states.first()?);
    if states.iter().all(|s| words(*s) == first) {
        return Some(first);
    }
    Some(
        states
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{i}: {}", words(*s)))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(state: u8, status: u32) -> FabricState {
        FabricState { state, status }
    }

    #[test]
    fn a_node_whose_gpus_all_joined_the_fabric_reads_completed() {
        assert_eq!(fabric_words(&[s(3, 0); 8]).as_deref(), Some("completed"));
        assert_eq!(
            fabric_words(&[s(0, 0); 4]).as_deref(),
            Some("not supported")
        );
        assert_eq!(fabric_words(&[]), None);
    }

    #[test]
    fn gpus_in_different_states_are_each_named() {
        assert_eq!(
            fabric_words(&[s(3, 0), s(1, 0), s(3, 999)]).as_deref(),
            Some("0: completed, 1: not started, 2: failed (NVML status 999)")
        );
    }
}
