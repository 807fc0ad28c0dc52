//! Which GPU product a name is: the one rule every crate identifies a product by, whether
//! the name comes from the node label (`NVIDIA-H100-80GB-HBM3`, as GPU feature discovery
//! writes `nvidia.com/gpu.product`) or from NVML (`NVIDIA H100 80GB HBM3`).

#![forbid(unsafe_code)]

/// A family of GPU products: the chip, whatever its memory, board or spelling. Whether a
/// variant (PCIe, NVL, SXM) is a product of its own is for each use to say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProductFamily {
    H200,
    H100,
    A100,
    /// B200, and GB200 (Grace Blackwell) whose name contains it.
    B200,
    /// B300, and GB300.
    B300,
    /// H20 (not H200).
    H20,
}

impl ProductFamily {
    /// Every family, in the order [`family`] looks for them: a name that contains two
    /// families' names is the first one's (so `H200` is never read as `H20`).
    pub const ALL: [ProductFamily; 6] = [
        ProductFamily::H200,
        ProductFamily::H100,
        ProductFamily::A100,
        ProductFamily::B200,
        ProductFamily::B300,
        ProductFamily::H20,
    ];

    /// The family's name, as it appears in product names.
    pub fn name(self) -> &'static str {
        match self {
            ProductFamily::H200 => "H200",
            ProductFamily::H100 => "H100",
            ProductFamily::A100 => "A100",
            ProductFamily::B200 => "B200",
            ProductFamily::B300 => "B300",
            ProductFamily::H20 => "H20",
        }
    }
}

/// Normalizes a product name so that the label form (`NVIDIA-H100-80GB-HBM3`) and NVML's
/// form (`NVIDIA H100 80GB HBM3`) compare equal: upper case, `-` and `_` as spaces, single
/// spaces, no `NVIDIA` prefix, and no `-SHARED` suffix (GPU feature discovery adds it under
/// time-slicing).
pub fn normalize(product: &str) -> String {
    let spaced: String = product
        .chars()
        .map(|c| match c {
            '-' | '_' => ' ',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    let mut words: Vec<&str> = spaced.split_whitespace().collect();
    if words.first() == Some(&"NVIDIA") {
        words.remove(0);
    }
    if words.last() == Some(&"SHARED") {
        words.pop();
    }
    words.join(" ")
}

/// The family of a product, by any spelling: the first of [`ProductFamily::ALL`] whose
/// name the [`normalize`]d name contains (`NVIDIA-GB200` is a B200, `NVIDIA H100 PCIe` an
/// H100); `None` for a product of no known family.
pub fn family(product: &str) -> Option<ProductFamily> {
    let n = normalize(product);
    ProductFamily::ALL
        .into_iter()
        .find(|f| n.contains(f.name()))
}

#[cfg(test)]
mod tests {
    use super::ProductFamily::*;
    use super::*;

    #[test]
    fn label_nvml_lowercase_and_shared_spellings_are_one_name() {
        let want = "H100 80GB HBM3";
        for s in [
            "NVIDIA-H100-80GB-HBM3",
            "NVIDIA H100 80GB HBM3",
            "nvidia-h100-80gb-hbm3",
            "NVIDIA-H100-80GB-HBM3-SHARED",
            "NVIDIA_H100_80GB_HBM3",
            "  NVIDIA  H100 80GB   HBM3 ",
            "H100-80GB-HBM3",
        ] {
            assert_eq!(normalize(s), want, "{s:?}");
        }
        assert_eq!(normalize(""), "");
        assert_eq!(normalize("NVIDIA"), "");
        // Only a leading NVIDIA and a trailing SHARED are dropped.
        assert_eq!(normalize("SHARED H100 NVIDIA"), "SHARED H100 NVIDIA");
    }

    #[test]
    fn every_spelling_the_measure_crate_accepted_has_its_family() {
        let cases: &[(&str, Option<ProductFamily>)] = &[
            ("NVIDIA-H100-80GB-HBM3", Some(H100)),
            ("NVIDIA H100 80GB HBM3", Some(H100)),
            ("nvidia-h100-80gb-hbm3", Some(H100)),
            ("NVIDIA-H100-80GB-HBM3-SHARED", Some(H100)),
            ("NVIDIA H100 PCIe", Some(H100)),
            ("NVIDIA-H100-PCIe", Some(H100)),
            ("NVIDIA H100 NVL", Some(H100)),
            ("NVIDIA H100 SXM5 80GB", Some(H100)),
            ("NVIDIA-H200", Some(H200)),
            ("NVIDIA H200", Some(H200)),
            ("nvidia-h200-shared", Some(H200)),
            ("NVIDIA H200 141GB HBM3e", Some(H200)),
            ("NVIDIA H200 NVL", Some(H200)),
            ("NVIDIA-A100-SXM4-80GB", Some(A100)),
            ("NVIDIA A100-SXM4-80GB", Some(A100)),
            ("NVIDIA A100 80GB PCIe", Some(A100)),
            ("nvidia-a100-sxm4-40gb", Some(A100)),
            ("NVIDIA-B200", Some(B200)),
            ("nvidia-b200", Some(B200)),
            ("NVIDIA B200", Some(B200)),
            ("NVIDIA-GB200", Some(B200)),
            ("NVIDIA B300", Some(B300)),
            ("NVIDIA GB300", Some(B300)),
            ("NVIDIA H20", Some(H20)),
            ("NVIDIA-H20-SHARED", Some(H20)),
            ("NVIDIA GeForce RTX 4090", None),
            ("NVIDIA L40S", None),
            ("NVIDIA H800", None),
            ("Tesla T4", None),
            ("Mystery GPU", None),
            ("", None),
        ];
        for (s, want) in cases {
            assert_eq!(family(s), *want, "{s:?}");
        }
    }

    #[test]
    fn the_first_family_named_wins() {
        // H200 before H100 and before H20, whose name it contains.
        assert_eq!(family("H100 H200"), Some(H200));
        assert_eq!(family("H200"), Some(H200));
        assert_eq!(family("H2000"), Some(H200));
        assert_eq!(family("H100 A100"), Some(H100));
        assert_eq!(family("A100 B200"), Some(A100));
        assert_eq!(family("H20 B200"), Some(B200));
    }

    #[test]
    fn names_are_what_family_looks_for() {
        for f in ProductFamily::ALL {
            assert_eq!(family(f.name()), Some(f));
            assert_eq!(family(&format!("NVIDIA-{}-SHARED", f.name())), Some(f));
        }
    }
}
