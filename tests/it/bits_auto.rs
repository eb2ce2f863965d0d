//! `--format mlx --bits auto`: widths chosen per coded linear from the decoded weights.

use crate::common::{escha_convert, fixture, stderr};
use serde_json::Value;

#[test]
fn widths_follow_the_trellis_rate_and_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg(&out)
        .args(["--quiet", "--json", "--format", "mlx", "--bits", "auto", "--measure-error"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let choices = report["width_choices"].as_array().unwrap();
    assert_eq!(choices.len(), 25, "every coded linear");
    let config: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    for c in choices {
        let (k, bits) = (c["k"].as_u64().unwrap(), c["bits"].as_u64().unwrap());
        let budget = c["budget"].as_f64().unwrap();
        assert_eq!(budget, 0.5 * 0.5f64.powi(k as i32));
        assert!(c["actual"].as_f64().unwrap() <= budget && c["predicted"].as_f64().unwrap() <= budget, "{c}");
        assert_eq!(c["estimate"]["bits"], c["bits"], "the estimate picks the measured width: {c}");
        assert_eq!((k, bits), (k, if k == 2 { 4 } else { 5 }), "{c}");
        let module = c["tensor"].as_str().unwrap().strip_suffix(".weight").unwrap();
        let quantization = &config["quantization"];
        let listed = quantization.get(module).map_or(quantization["bits"].as_u64(), |q| q["bits"].as_u64());
        assert_eq!(listed, Some(bits), "config.json says the width: {module}");
    }
    let bpw = report["affine_bits_per_weight"].as_f64().unwrap();
    assert!((4.0..8.0).contains(&bpw), "{bpw}");

    // inspect predicts the size from a few blocks per linear.
    let o = escha_convert().arg("inspect").arg(fixture("dense")).arg("--json").output().unwrap();
    let inspect: Value = serde_json::from_slice(&o.stdout).unwrap();
    let written: u64 = report["tensors"].as_array().unwrap().iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(inspect["sizes"]["mlx_auto_bytes"].as_u64(), Some(written));
}

#[test]
fn auto_options_need_bits_auto() {
    for args in
        [&["--format", "mlx", "--max-added-error", "0.3"][..], &["--format", "mlx", "--bits", "4", "--measure-error"]]
    {
        let o = escha_convert().arg(fixture("dense")).arg("/tmp/never-written").args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
    let o = escha_convert()
        .arg(fixture("dense"))
        .arg("/tmp/never-written")
        .args(["--format", "mlx", "--bits", "7"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("or auto"));
}
