//! Whether a suite fits the GPUs it runs on: every part's buffers
//! ([`Suite::memory_needs`]) against a GPU's memory. A suite that cannot fit is the test's
//! fault, never the GPU's: refused when the test is written (against the GPU product it
//! selects, or the largest known one), and at run time against the node's own GPUs.

use super::{Problem, ValidationError, validate};
use crate::suite::{MemoryNeed, Suite, bytes_text as size};
use crate::test::FabricTestSpec;

/// How the GPU a suite is held against was chosen; it says so in the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    /// The known product the test's nodeSelector names (`nvidia.com/gpu.product`).
    NodeSelector,
    /// The test names no known product: the known product with the most memory, so only
    /// a suite no GPU can hold is refused.
    LargestKnown,
    /// The GPUs of the node being measured (the smallest of them).
    ThisNode,
}

/// A GPU a suite must fit: its product, its memory and how it was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemory<'a> {
    pub product: &'a str,
    /// Bytes of device memory (as the driver reports it: `cuDeviceTotalMem`, nvidia-smi).
    pub bytes: u64,
    pub chosen: Chosen,
}

impl GpuMemory<'_> {
    /// What the need is more than: "the 79.6 GiB of one H100 80GB HBM3 GPU, ...", with what to do.
    fn describe(&self) -> String {
        let mem = size(self.bytes);
        let product = self.product;
        match self.chosen {
            Chosen::NodeSelector => format!(
                "the {mem} of one {product} GPU, the product nodeSelector selects; lower it, or select nodes with larger GPUs"
            ),
            Chosen::LargestKnown => {
                format!("any known GPU holds (the largest, {product}, has {mem}); lower it")
            }
            Chosen::ThisNode => format!(
                "this node's {product} GPUs hold ({mem}); lower it, or run the test on nodes with larger GPUs"
            ),
        }
    }
}

/// The problem of one part of a suite larger than `gpu`'s memory, naming its field, the
/// bytes it needs on each GPU and the rule that gives them; None when it fits.
pub fn need_problem(need: &MemoryNeed, gpu: &GpuMemory) -> Option<Problem> {
    (need.bytes > gpu.bytes).then(|| Problem {
        field: need.field.to_string(),
        message: format!(
            "needs {} on each GPU ({}), more than {}",
            size(need.bytes),
            need.rule,
            gpu.describe()
        ),
    })
}

/// Every part of `suite` on a node of `gpus` GPUs (the NCCL sweep over `sweep_sizes`) that
/// `gpu` cannot hold.
pub fn suite_problems(
    suite: &Suite,
    gpus: u32,
    sweep_sizes: &[u64],
    gpu: &GpuMemory,
) -> Vec<Problem> {
    suite
        .memory_needs(gpus, sweep_sizes)
        .iter()
        .filter_map(|need| need_problem(need, gpu))
        .collect()
}

/// [`validate`], and that `gpu` holds the suite. Held at the fewest GPUs a node has (one):
/// the buffers grow with the GPU count by a few bytes, so a suite refused here fits no node.
pub fn validate_for(spec: &FabricTestSpec, gpu: &GpuMemory) -> Result<(), ValidationError> {
    let mut problems = validate(spec).err().map(|e| e.problems).unwrap_or_default();
    problems.extend(suite_problems(
        &spec.suite,
        1,
        &spec.suite.nccl_sweep.sizes(),
        gpu,
    ));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ValidationError { problems })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::Phase;

    const H100: GpuMemory<'static> = GpuMemory {
        product: "H100 80GB HBM3",
        bytes: 81_559 << 20,
        chosen: Chosen::NodeSelector,
    };

    fn spec(json: serde_json::Value) -> FabricTestSpec {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("spec does not parse: {e}"))
    }

    #[test]
    fn a_sweep_of_a_tebibyte_is_refused_naming_its_field_the_rule_and_the_gpu() {
        let s = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 1u64 << 40}}}));
        let err = validate_for(&s, &H100).expect_err("1 TiB cannot fit 80 GB");
        assert_eq!(err.problems.len(), 1, "{err}");
        let p = &err.problems[0];
        assert_eq!(p.field, "suite.ncclSweep.maxBytes");
        assert!(
            p.message.contains("needs 3.0 TiB on each GPU"),
            "{}",
            p.message
        );
        assert!(
            p.message
                .contains("3 x 1.0 TiB, the largest size the sweep runs"),
            "{}",
            p.message
        );
        assert!(
            p.message.contains("the GPU count does not multiply it"),
            "{}",
            p.message
        );
        assert!(
            p.message.contains("79.6 GiB of one H100 80GB HBM3 GPU")
                && p.message.contains("nodeSelector"),
            "{}",
            p.message
        );
        // The whole error names the field too, as the webhook and the InvalidSpec condition show it.
        assert!(
            err.to_string()
                .contains("suite.ncclSweep.maxBytes: needs 3.0 TiB"),
            "{err}"
        );
    }

    #[test]
    fn the_message_quotes_the_size_its_rule_multiplies() {
        // 40 GiB on an 80 GB GPU: the sweep's largest size is 32 GiB, three buffers 96 GiB.
        let s = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 40u64 << 30}}}));
        let err = validate_for(&s, &H100).expect_err("96 GiB cannot fit 80 GB");
        let m = &err.problems[0].message;
        assert!(m.contains("needs 96.0 GiB on each GPU"), "{m}");
        assert!(
            m.contains("(3 x 32.0 GiB, the largest size the sweep runs"),
            "{m}"
        );
        assert!(!m.contains("maxBytes:"), "{m}");
    }

    #[test]
    fn three_buffers_of_the_largest_size_are_the_sweeps_need() {
        // 16 GiB: three buffers of 48 GiB fit 80 GB; 32 GiB (96 GiB) does not.
        let fits = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 16u64 << 30}}}));
        assert_eq!(validate_for(&fits, &H100), Ok(()));
        let over = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 32u64 << 30}}}));
        assert!(validate_for(&over, &H100).is_err());
        // The largest size the sweep runs counts, not maxBytes: 8 x 2^k never reaches 26 GiB + 1.
        let s = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": (26u64 << 30) + 1}}}));
        let needs = s.suite.memory_needs(8, &s.suite.nccl_sweep.sizes());
        let nccl = needs
            .iter()
            .find(|n| n.phase == Phase::NcclSweep)
            .expect("the sweep is on");
        assert_eq!(nccl.bytes, 3 * ((16u64 << 30) + 8 * 4));
    }

    #[test]
    fn the_default_suite_fits_every_gpu_of_40_gib() {
        let gpu = GpuMemory {
            product: "A100 40GB",
            bytes: 40 << 30,
            chosen: Chosen::ThisNode,
        };
        let s = spec(serde_json::json!({"suite": {"nodePairs": {"enabled": true}}}));
        assert_eq!(validate_for(&s, &gpu), Ok(()));
        for gpus in [1, 2, 4, 8] {
            assert!(suite_problems(&s.suite, gpus, &s.suite.nccl_sweep.sizes(), &gpu).is_empty());
        }
    }

    #[test]
    fn every_part_too_large_is_named_and_a_disabled_part_is_not() {
        let s = spec(serde_json::json!({"suite": {
            "gpuPairs": {"bytes": 64u64 << 30},
            "ddpProbe": {"hidden": 65536, "layers": 64},
            "nodePairs": {"enabled": true, "bytes": 64u64 << 30},
            "ncclSweep": {"enabled": false, "maxBytes": 1u64 << 40},
        }}));
        let err = validate_for(&s, &H100).expect_err("too large");
        let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "suite.gpuPairs.bytes",
                "suite.ddpProbe",
                "suite.nodePairs.bytes"
            ]
        );
    }

    #[test]
    fn a_test_naming_no_product_is_held_against_the_largest_known_gpu() {
        let largest = GpuMemory {
            product: "B200",
            bytes: 183_359 << 20,
            chosen: Chosen::LargestKnown,
        };
        // 48 GiB a buffer does not fit an H100 but fits a B200: allowed.
        let s = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 48u64 << 30}}}));
        assert_eq!(validate_for(&s, &largest), Ok(()));
        let s = spec(serde_json::json!({"suite": {"ncclSweep": {"maxBytes": 1u64 << 40}}}));
        let err = validate_for(&s, &largest).expect_err("no GPU holds 3 TiB");
        assert!(
            err.to_string()
                .contains("more than any known GPU holds (the largest, B200, has 179.1 GiB)"),
            "{err}"
        );
    }

    #[test]
    fn other_problems_are_kept_beside_the_memory_problem() {
        let s = spec(serde_json::json!({
            "schedule": "0 0 31 2 *",
            "suite": {"ncclSweep": {"maxBytes": 1u64 << 40}},
        }));
        let err = validate_for(&s, &H100).expect_err("two problems");
        let fields: Vec<&str> = err.problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["schedule", "suite.ncclSweep.maxBytes"]);
    }

    #[test]
    fn the_ddp_replica_is_counted_as_the_backend_allocates_it() {
        let d = crate::suite::DdpProbe::default();
        // 8192 x 8192 x 8 layers at 4096 samples: 1 GiB of bf16 weights, 2 GiB of fp32
        // gradients, 0.5 GiB of activations, 64 MiB of output gradients, 0.5 GiB scratch.
        let (h, l, b) = (8192u64, 8u64, 4096u64);
        let expected = h * h * 2 * l
            + b * h * 2 * (l + 1)
            + 2 * b * h * 2
            + l * (4 * h + 4 * h * h)
            + 8 * h * h;
        assert_eq!(d.replica_bytes(), expected);
        assert_eq!(size(expected), "4.2 GiB");
    }

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(size(512 << 20), "512 MiB");
        assert_eq!(size(81_559 << 20), "79.6 GiB");
        assert_eq!(size(3 << 40), "3.0 TiB");
    }
}
