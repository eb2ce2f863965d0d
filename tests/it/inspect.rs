//! `inspect` on the bundled fixtures.

use crate::common::{fixture, stderr};
use serde_json::Value;

fn inspect(model: &str) -> Value {
    let o = crate::common::escha_convert().arg("inspect").arg(fixture(model)).arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn dense_fixture_facts() {
    let r = inspect("dense");
    assert_eq!(r["model_type"], "qwen3_5");
    assert_eq!(r["quant_method"], "escha");
    assert_eq!(r["layers"], 4);
    let coded = r["coded"].as_array().unwrap();
    assert_eq!(coded.len(), 25);
    // Weighted by weights: up/down (4 × 2 × 128×256) at K=3, the rest at K=2.
    let k3 = coded
        .iter()
        .filter(|c| c["k"] == 3)
        .map(|c| c["in_features"].as_u64().unwrap() * c["out_features"].as_u64().unwrap())
        .sum::<u64>();
    let all = r["coded_weights"].as_u64().unwrap();
    assert_eq!(k3, 4 * 2 * 128 * 256);
    let want = (3 * k3 + 2 * (all - k3)) as f64 / all as f64;
    assert!((r["bits_per_weight"].as_f64().unwrap() - want).abs() < 1e-12);
    assert!(coded.iter().all(|c| c["codebook"] == "MCG" && c["has_s_in_s_out"] == true && c["bias_nonzero"] == true));
    assert_eq!(r["int8"].as_array().unwrap().len(), 2);
    assert_eq!((r["biases_present"].as_u64(), r["biases_nonzero"].as_u64()), (Some(25), Some(25)));
    assert_eq!((r["norms_zero_centred"].as_u64(), r["norms_plain"].as_u64()), (Some(18), Some(3)));
    assert!(r["norm_convention"].as_str().unwrap().starts_with("zero-centred"));
    assert_eq!(r["mtp"], true);
    assert!(r["problems"].as_array().unwrap().is_empty());
}

#[test]
fn predicted_sizes_are_what_each_format_writes() {
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dense", "moe"] {
        let r = inspect(model);
        for (format, key) in
            [("bf16", "bf16_bytes"), ("f16", "f16_bytes"), ("mlx", "mlx_4bit_bytes"), ("exl3", "exl3_bytes")]
        {
            let out = tmp.path().join(format!("{model}-{format}"));
            let ok = crate::common::escha_convert()
                .arg(fixture(model))
                .arg(&out)
                .args(["--quiet", "--format", format])
                .status()
                .unwrap()
                .success();
            assert!(ok);
            let index: Value =
                serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap()).unwrap();
            assert_eq!(r["sizes"][key], index["metadata"]["total_size"], "{model} {format}");
        }
    }
}

#[test]
fn moe_fixture_reports_experts_and_pruned_channels() {
    let r = inspect("moe");
    assert_eq!(r["quant_method"], "eschamoe");
    let coded = r["coded"].as_array().unwrap();
    assert_eq!(coded.len(), 8);
    for c in coded {
        assert_eq!(c["experts"], 4);
        let pruned = c["zero_rout_channels"].as_u64().unwrap();
        if c["module"].as_str().unwrap().ends_with("gate_up_proj") {
            assert!(pruned > 0, "{}", c["module"]);
        } else {
            assert_eq!(pruned, 0, "{}", c["module"]);
        }
    }
    assert!(r["sizes"]["mlx_4bit_bytes"].as_u64().unwrap() < r["sizes"]["bf16_bytes"].as_u64().unwrap());
}

/// The dense 27B's coded shapes (format doc §10.2) in a sparse file: the header is real, the data
/// zeros that take no disk. `inspect` must report the published 2.469 bits per weight.
#[test]
fn the_27b_shapes_give_the_published_bits_per_weight() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    let mut add = |name: String, dtype: &str, shape: Vec<u64>, el: u64| {
        let len = shape.iter().product::<u64>() * el;
        header
            .insert(name, serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}));
        offset += len;
    };
    for layer in 0..64 {
        let p = format!("model.language_model.layers.{layer}");
        let mut coded: Vec<(String, u64, u64, u64)> = vec![
            (format!("{p}.mlp.gate_proj"), 5120, 17408, 2),
            (format!("{p}.mlp.up_proj"), 5120, 17408, 3),
            (format!("{p}.mlp.down_proj"), 17408, 5120, 3),
        ];
        if (layer + 1) % 4 == 0 {
            for (proj, ic, oc) in
                [("q_proj", 5120, 12288), ("k_proj", 5120, 1024), ("v_proj", 5120, 1024), ("o_proj", 6144, 5120)]
            {
                coded.push((format!("{p}.self_attn.{proj}"), ic, oc, 2));
            }
        } else {
            for (proj, ic, oc) in [("in_proj_qkv", 5120, 10240), ("in_proj_z", 5120, 6144), ("out_proj", 6144, 5120)] {
                coded.push((format!("{p}.linear_attn.{proj}"), ic, oc, 2));
            }
        }
        for (m, ic, oc, k) in coded {
            add(format!("{m}.escha_code"), "I16", vec![ic / 16, oc / 16, 16 * k], 2);
            add(format!("{m}.escha_rin"), "F16", vec![ic], 2);
            add(format!("{m}.escha_rout"), "F16", vec![oc], 2);
        }
    }
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut f, &(text.len() as u64).to_le_bytes()).unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f.set_len(8 + text.len() as u64 + offset).unwrap();

    let o = crate::common::escha_convert().arg("inspect").arg(&path).arg("--json").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["coded"].as_array().unwrap().len(), 400);
    assert_eq!(r["coded_weights"], 24_326_963_200u64);
    assert_eq!(format!("{:.3}", r["bits_per_weight"].as_f64().unwrap()), "2.469");
}
