//! The low-bit `--gguf-type`s (`q2_k`, `q3_k_s`, `q3_k_m`, `q3_k_l`, `iq4_xs`): each writes a file
//! llama.cpp's loader reads, with llama.cpp's file type number, its main block type where rows are
//! 256 wide and llama-quantize's 32-value fallback (`Q4_0`, `IQ4_NL`) where they are not, the same
//! bytes at every thread count. (`tests/python/test_gguf_kquants.py` compares types and bytes with
//! llama-quantize itself.)

use crate::common::fixture;
use crate::gguf::convert;
use crate::gguf_reader::{check_layout, TensorInfo, Val};
use std::collections::BTreeSet;

/// `--gguf-type`, `general.file_type` (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`), the type of a 256-wide
/// linear no rule singles out (the dense fixture's `ssm_out`), the fallback for 128-wide rows.
const CASES: [(&str, i128, &str, &str); 5] = [
    ("q2_k", 10, "Q2_K", "Q4_0"),
    ("q3_k_s", 11, "Q3_K", "Q4_0"),
    ("q3_k_m", 12, "Q3_K", "Q4_0"),
    ("q3_k_l", 13, "Q3_K", "Q4_0"),
    ("iq4_xs", 30, "IQ4_XS", "IQ4_NL"),
];

#[test]
fn low_bit_file_types_write_their_blocks_and_fallbacks() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        for (ty, file_type, main, fallback) in CASES {
            let case = format!("{model} --gguf-type {ty}");
            let out = tmp.path().join(format!("{model}-{ty}"));
            convert(&fixture(model), &out, &["--gguf-type", ty, "--int8", "requant", "-j2"]);
            let f = check_layout(&out.join("model.gguf"));
            assert_eq!(f.get("general.file_type"), Some(&Val::Int(4, file_type)), "{case}");
            let types: BTreeSet<&str> = f.tensors.iter().map(TensorInfo::type_name).collect();
            assert!(types.contains(fallback), "{case}: no {fallback} among {types:?}");
            let again = tmp.path().join(format!("{model}-{ty}-j1"));
            convert(&fixture(model), &again, &["--gguf-type", ty, "--int8", "requant", "-j1"]);
            let (a, b) =
                (std::fs::read(out.join("model.gguf")).unwrap(), std::fs::read(again.join("model.gguf")).unwrap());
            assert!(a == b, "{case}: -j1 and -j2 differ");
            if model == "dense" {
                let ssm_out = f.tensors.iter().find(|t| t.name == "blk.0.ssm_out.weight").expect("ssm_out");
                assert_eq!(ssm_out.dims[0], 256, "{case}: the fixture's ssm_out rows");
                assert_eq!(ssm_out.type_name(), main, "{case}: blk.0.ssm_out.weight");
            }
        }
    }
}
