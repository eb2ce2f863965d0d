//! The mixtures against llama-quantize's recorded choices and llama.cpp's rules.

use super::*;
use serde_json::Value;

/// llama-quantize's choices (scripts/gguf-mixture-cases.py).
const CASES: &str = "fixtures/gguf-mixtures.json";

fn model(names: &[(&str, &[usize])], block_count: u32, expert_count: u32) -> ModelShape {
    ModelShape::new(block_count, expert_count, names.iter().copied())
}

/// The block type `name` gets, `None` where it stays as it is (a float type fails the test).
fn ty(mixture: Mixture, m: &ModelShape, name: &str, shape: &[usize]) -> Option<BlockType> {
    tensor_type(mixture, m, name, shape, false).unwrap().map(|s| match s {
        Storage::Block(b) => b,
        Storage::Element(d) => panic!("{name}: {d:?}"),
    })
}

/// The storage llama-quantize's report names `name` (gguf-py's spelling: `BF16`, `Q4_K`).
fn named(name: &str) -> Storage {
    [Dtype::F32, Dtype::F16, Dtype::BF16]
        .map(Storage::Element)
        .into_iter()
        .chain(BlockType::ALL.map(Storage::Block))
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no storage is named {name}"))
}

#[test]
fn matches_llama_quantize_on_every_case() {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CASES)).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    for (mixture, ft) in doc["file_types"].as_object().unwrap() {
        assert_eq!(Mixture::from_name(mixture).unwrap().file_type() as u64, ft.as_u64().unwrap(), "{mixture}");
    }
    let mut checked = 0;
    let mut wrong = Vec::new();
    for m in doc["models"].as_array().unwrap() {
        let arch = m["arch"].as_str().unwrap();
        let kv = |key: &str| {
            let key = format!("{arch}.{key}");
            m["kv"].as_array().unwrap().iter().find(|e| e[0] == key.as_str()).map(|e| e[2].as_u64().unwrap() as u32)
        };
        let tensors: Vec<(String, Vec<usize>, Storage)> = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let shape = t[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                (t[0].as_str().unwrap().to_string(), shape, named(t[2].as_str().unwrap()))
            })
            .collect();
        let heads = kv("attention.head_count").unwrap();
        let shape = ModelShape::new(
            kv("block_count").unwrap(),
            kv("expert_count").unwrap_or(0),
            tensors.iter().map(|(n, s, _)| (n.as_str(), s.as_slice())),
        )
        .with_heads(heads, kv("attention.head_count_kv").unwrap_or(heads));
        let types = m["types"].as_object().unwrap();
        assert_eq!(types.len(), Mixture::ALL.len());
        for (mixture, want) in types {
            let mixture = Mixture::from_name(mixture).unwrap();
            let want: Vec<&str> = want.as_str().unwrap().split(' ').collect();
            assert_eq!(want.len(), tensors.len());
            for ((name, dims, input), want) in tensors.iter().zip(want) {
                // The low-bit mixtures are recorded with an importance matrix.
                let imatrix = Mixture::LOW_BIT.contains(&mixture);
                let got = tensor_type(mixture, &shape, name, dims, imatrix).unwrap().unwrap_or(*input);
                if got.name() != want {
                    wrong.push(format!(
                        "{} {} {name} {dims:?}: ours {}, llama-quantize {want}",
                        m["name"],
                        mixture.name(),
                        got.name()
                    ));
                }
                checked += 1;
            }
        }
    }
    assert!(wrong.is_empty(), "{} of {checked} differ:\n{}", wrong.len(), wrong.join("\n"));
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn never_quantized() {
    let m = model(&[], 4, 0);
    for (name, shape) in [
        ("blk.0.attn_norm.weight", &[128][..]),
        ("blk.0.ssm_a", &[2]),
        ("blk.0.ssm_dt.bias", &[2]),
        ("blk.0.ssm_conv1d.weight", &[384, 4]),
        ("blk.0.ffn_gate_inp.weight", &[4, 128]),
        // [1, hidden]: one dimension for ggml.
        ("blk.0.ffn_gate_inp_shexp.weight", &[1, 128]),
        ("blk.3.attn_q_norm.weight", &[128]),
    ] {
        assert_eq!(ty(Mixture::Q4KM, &m, name, shape), None, "{name}");
    }
    // 2-D, ending in `weight`: quantized, though llama.cpp's converter names them like norms.
    assert_eq!(ty(Mixture::Q4KM, &m, "blk.0.ssm_alpha.weight", &[2, 256]), Some(BlockType::Q4_K));
    assert_eq!(ty(Mixture::Q4KM, &m, "blk.3.nextn.eh_proj.weight", &[256, 512]), Some(BlockType::Q4_K));
}

#[test]
fn fallback_for_short_rows() {
    use BlockType as T;
    let f16 = Storage::Element(Dtype::F16);
    for (t, n, want) in [
        (T::Q4_K, 256, Storage::Block(T::Q4_K)),
        (T::Q4_K, 128, Storage::Block(T::Q5_0)),
        (T::Q5_K, 128, Storage::Block(T::Q5_1)),
        (T::Q6_K, 128, Storage::Block(T::Q8_0)),
        (T::Q8_0, 128, Storage::Block(T::Q8_0)),
        (T::Q4_K, 80, f16),
        (T::Q8_0, 80, f16),
    ] {
        assert_eq!(fallback(t, n), want, "{t:?} {n}");
    }
}

#[test]
fn output_and_embeddings() {
    let untied = model(&[("output.weight", &[64, 256]), ("token_embd.weight", &[64, 256])], 4, 0);
    let tied = model(&[("token_embd.weight", &[64, 256])], 4, 0);
    assert_eq!(ty(Mixture::Q4KM, &untied, "output.weight", &[64, 256]), Some(BlockType::Q6_K));
    assert_eq!(ty(Mixture::Q4KM, &untied, "token_embd.weight", &[64, 256]), Some(BlockType::Q4_K));
    assert_eq!(ty(Mixture::Q4KM, &tied, "token_embd.weight", &[64, 256]), Some(BlockType::Q6_K));
    assert_eq!(ty(Mixture::Q8_0, &tied, "token_embd.weight", &[64, 256]), Some(BlockType::Q8_0));
    // A row not a multiple of the mixture's block: Q8_0, not the Q6_K → Q8_0 fallback's way.
    assert_eq!(ty(Mixture::Q5KM, &untied, "output.weight", &[64, 128]), Some(BlockType::Q8_0));
}

#[test]
fn layer_positions() {
    // 64 blocks + 1 MTP block: the first 8, from 56 on, and every third between get more bits.
    let names: Vec<String> = (0..65).map(|b| format!("blk.{b}.ffn_down.weight")).collect();
    let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
    let m = ModelShape::new(65, 0, tensors.iter().copied());
    let q6: Vec<usize> =
        (0..65).filter(|&b| ty(Mixture::Q4KM, &m, &names[b], &[256, 512]) == Some(BlockType::Q6_K)).collect();
    let want: Vec<usize> = (0..8).chain((10..56).step_by(3)).chain(56..65).collect();
    assert_eq!(q6, want);
    let q5: Vec<usize> =
        (0..65).filter(|&b| ty(Mixture::Q4KS, &m, &names[b], &[256, 512]) == Some(BlockType::Q5_K)).collect();
    assert_eq!(q5, (0..8).collect::<Vec<_>>());
    // The counter follows llama.cpp's order (block, then name), not the order given.
    let mut rev = tensors.clone();
    rev.reverse();
    assert_eq!(ModelShape::new(65, 0, rev), m);
}

#[test]
fn eight_experts() {
    let m = model(&[("blk.0.attn_qkv.weight", &[512, 256])], 24, 8);
    assert_eq!(ty(Mixture::Q4KM, &m, "blk.0.attn_qkv.weight", &[512, 256]), Some(BlockType::Q8_0));
    assert_eq!(ty(Mixture::Q5KM, &m, "blk.3.attn_k.weight", &[128, 256]), Some(BlockType::Q8_0));
    assert_eq!(ty(Mixture::Q4KM, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q5_K));
    assert_eq!(ty(Mixture::Q5KM, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q5_K));
    assert_eq!(ty(Mixture::Q6K, &m, "blk.3.attn_output.weight", &[256, 256]), Some(BlockType::Q6_K));
    assert!(tensor_type(Mixture::Q4KM, &m, "blk.24.ffn_up_exps.weight", &[8, 32, 256], false).is_err());
}

#[test]
fn file_types() {
    let ft: Vec<u32> = Mixture::ALL.iter().map(|m| m.file_type()).collect();
    assert_eq!(ft, [15, 14, 17, 16, 18, 7, 10, 11, 12, 13, 30, 19, 20, 28, 29, 23, 22, 26, 27, 21]);
}

#[test]
fn low_bit_rules() {
    use BlockType as T;
    let names: Vec<String> = (0..16).map(|b| format!("blk.{b}.attn_v.weight")).collect();
    let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
    let one = ModelShape::new(16, 0, tensors.iter().copied());
    // Four query heads per key/value head: llama.cpp gives attn_v more bits.
    let gqa4 = one.clone().with_heads(8, 2);
    let v = |m: Mixture, shape: &ModelShape, b: usize| ty(m, shape, &names[b], &[256, 512]);
    assert_eq!(v(Mixture::Q2K, &one, 5), Some(T::Q3_K));
    assert_eq!(v(Mixture::Q2K, &gqa4, 5), Some(T::Q4_K));
    assert_eq!(v(Mixture::IQ4XS, &one, 5), Some(T::IQ4_XS));
    assert_eq!(v(Mixture::IQ4XS, &gqa4, 5), Some(T::Q5_K));
    assert_eq!(v(Mixture::Q3KS, &gqa4, 5), Some(T::Q3_K));
    assert_eq!(v(Mixture::Q3KL, &one, 5), Some(T::Q5_K));
    let q3km: Vec<Option<BlockType>> = (0..4).map(|b| v(Mixture::Q3KM, &one, b)).collect();
    assert_eq!(q3km, [Some(T::Q5_K), Some(T::Q5_K), Some(T::Q4_K), Some(T::Q4_K)]);
    // No key/value heads: a ratio of 0, never 4.
    assert_eq!(v(Mixture::Q2K, &one.clone().with_heads(8, 0), 5), Some(T::Q3_K));

    // ffn_down by position among 32 blocks; attn_output by mixture.
    let names: Vec<String> = (0..32).map(|b| format!("blk.{b}.ffn_down.weight")).collect();
    let tensors: Vec<(&str, &[usize])> = names.iter().map(|n| (n.as_str(), &[256usize, 512][..])).collect();
    let m = ModelShape::new(32, 0, tensors.iter().copied());
    let down = |mix: Mixture, b: usize| ty(mix, &m, &names[b], &[256, 512]);
    assert_eq!((down(Mixture::Q2K, 0), down(Mixture::Q2K, 31)), (Some(T::Q3_K), Some(T::Q3_K)));
    assert_eq!((down(Mixture::Q3KM, 1), down(Mixture::Q3KM, 2)), (Some(T::Q5_K), Some(T::Q4_K)));
    assert_eq!(down(Mixture::Q3KL, 20), Some(T::Q5_K));
    assert_eq!((down(Mixture::IQ4XS, 3), down(Mixture::IQ4XS, 4)), (Some(T::Q5_K), Some(T::IQ4_XS)));
    // With an importance matrix llama-quantize keeps IQ4_XS there (and Q4_K_S its Q5_K).
    let weighted = |mix: Mixture, b: usize| {
        tensor_type(mix, &m, &names[b], &[256, 512], true).unwrap().map(|s| match s {
            Storage::Block(b) => b,
            Storage::Element(d) => panic!("{d:?}"),
        })
    };
    assert_eq!((weighted(Mixture::IQ4XS, 3), weighted(Mixture::Q4KS, 3)), (Some(T::IQ4_XS), Some(T::Q5_K)));
    assert_eq!(down(Mixture::Q3KS, 0), Some(T::Q3_K));
    let out = |mix: Mixture| ty(mix, &m, "blk.3.attn_output.weight", &[256, 256]);
    let outs = [Mixture::Q2K, Mixture::Q3KS, Mixture::Q3KM, Mixture::Q3KL, Mixture::IQ4XS].map(out);
    assert_eq!(outs, [Some(T::Q3_K), Some(T::Q3_K), Some(T::Q4_K), Some(T::Q5_K), Some(T::IQ4_XS)]);
    // The output takes Q6_K whatever the mixture.
    assert_eq!(ty(Mixture::Q2K, &m, "output.weight", &[64, 256]), Some(T::Q6_K));
}

#[test]
fn low_bit_fallbacks() {
    use BlockType as T;
    let f16 = Storage::Element(Dtype::F16);
    for (t, n, want) in [
        (T::Q2_K, 128, Storage::Block(T::Q4_0)),
        (T::Q3_K, 160, Storage::Block(T::Q4_0)),
        (T::IQ4_XS, 128, Storage::Block(T::IQ4_NL)),
        (T::IQ4_XS, 512, Storage::Block(T::IQ4_XS)),
        (T::Q2_K, 80, f16),
        (T::IQ4_XS, 80, f16),
        (T::IQ4_NL, 96, Storage::Block(T::IQ4_NL)),
    ] {
        assert_eq!(fallback(t, n), want, "{t:?} {n}");
    }
}

/// A dense model of 16 blocks with attention, gate, up and down in each, and an output.
fn dense16() -> (ModelShape, Vec<(String, Vec<usize>)>) {
    let mut tensors: Vec<(String, Vec<usize>)> =
        vec![("output.weight".into(), vec![64, 256]), ("token_embd.weight".into(), vec![64, 256])];
    for b in 0..16 {
        for (kind, shape) in [
            ("attn_q", vec![512, 256]),
            ("attn_k", vec![128, 256]),
            ("attn_v", vec![128, 256]),
            ("attn_output", vec![256, 512]),
            ("ffn_gate", vec![512, 256]),
            ("ffn_up", vec![512, 256]),
            ("ffn_down", vec![256, 512]),
        ] {
            tensors.push((format!("blk.{b}.{kind}.weight"), shape));
        }
    }
    let m = ModelShape::new(16, 0, tensors.iter().map(|(n, s)| (n.as_str(), s.as_slice())));
    (m, tensors)
}

#[test]
fn iq_mixtures_follow_llama_cpps_rules() {
    use BlockType as T;
    use Mixture as M;
    let (m, _) = dense16();
    let gqa4 = m.clone().with_heads(8, 2);
    let at = |mix: Mixture, shape: &ModelShape, name: &str, imatrix: bool| {
        let dims: &[usize] =
            if name.contains("ffn_down") || name.contains("attn_output") { &[256, 512] } else { &[512, 256] };
        match tensor_type(mix, shape, name, dims, imatrix).unwrap() {
            Some(Storage::Block(b)) => b,
            other => panic!("{name}: {other:?}"),
        }
    };
    let defaults = M::LOW_BIT.map(|mix| at(mix, &m, "blk.0.ffn_up.weight", true));
    assert_eq!(
        defaults,
        [T::IQ2_XXS, T::IQ2_XS, T::IQ2_XS, T::IQ2_S, T::IQ3_XXS, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::Q2_K]
    );
    let files = M::LOW_BIT.map(M::file_type);
    assert_eq!(files, [19, 20, 28, 29, 23, 22, 26, 27, 21]);
    for mix in M::LOW_BIT {
        assert_eq!(Mixture::from_name(mix.name()), Some(mix));
    }
    // Output and embeddings.
    let out = M::LOW_BIT.map(|mix| at(mix, &m, "output.weight", true));
    assert_eq!(out, [T::Q5_K, T::Q5_K, T::Q5_K, T::Q5_K, T::Q5_K, T::Q6_K, T::Q6_K, T::Q6_K, T::Q6_K]);
    let embd = M::LOW_BIT.map(|mix| at(mix, &m, "token_embd.weight", true));
    assert_eq!(embd, [T::Q2_K, T::Q2_K, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::Q2_K]);
    // attn_v: the IQ2 family lifts it, more with grouped queries.
    let v = M::LOW_BIT.map(|mix| at(mix, &m, "blk.5.attn_v.weight", true));
    assert_eq!(v, [T::Q2_K, T::Q2_K, T::IQ3_S, T::IQ3_S, T::IQ3_XXS, T::IQ3_S, T::IQ3_S, T::Q4_K, T::Q2_K]);
    let v4 = M::LOW_BIT.map(|mix| at(mix, &gqa4, "blk.5.attn_v.weight", true));
    assert_eq!(v4, [T::Q4_K; 9]);
    // Without an importance matrix IQ3_XXS keeps attn_v at IQ3_S and raises ffn_down.
    assert_eq!(at(M::IQ3XXS, &m, "blk.5.attn_v.weight", false), T::IQ3_S);
    assert_eq!(at(M::IQ3XXS, &m, "blk.1.ffn_down.weight", false), T::Q4_K);
    assert_eq!(at(M::IQ3XXS, &m, "blk.2.ffn_down.weight", false), T::Q3_K);
    assert_eq!(at(M::IQ3XXS, &m, "blk.1.ffn_down.weight", true), T::IQ3_XXS);
    // ffn_down: the first eighth (blocks 0, 1 of 16) lifted.
    let down = |mix: Mixture, b: usize| at(mix, &m, &format!("blk.{b}.ffn_down.weight"), true);
    assert_eq!([down(M::IQ2XXS, 1), down(M::IQ2XXS, 2)], [T::Q2_K, T::IQ2_XXS]);
    assert_eq!([down(M::IQ2M, 1), down(M::IQ2M, 2)], [T::IQ3_S, T::IQ2_S]);
    assert_eq!([down(M::Q2KS, 1), down(M::Q2KS, 2)], [T::Q4_K, T::Q2_K]);
    assert_eq!([down(M::IQ3M, 1), down(M::IQ3M, 2)], [T::Q4_K, T::IQ3_S]);
    // IQ4_XS raises the first eighth only without an importance matrix.
    assert_eq!(at(M::IQ4XS, &m, "blk.1.ffn_down.weight", false), T::Q5_K);
    assert_eq!(down(M::IQ4XS, 1), T::IQ4_XS);
    // attn_output, attn_q and attn_k.
    let o = M::LOW_BIT.map(|mix| at(mix, &m, "blk.5.attn_output.weight", true));
    assert_eq!(o, [T::IQ2_XXS, T::IQ2_XS, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::IQ3_S, T::Q4_K, T::Q2_K]);
    let q = M::LOW_BIT.map(|mix| at(mix, &m, "blk.5.attn_q.weight", true));
    assert_eq!(q, [T::IQ2_XXS, T::IQ2_XS, T::IQ2_XS, T::IQ2_S, T::IQ2_S, T::IQ3_XXS, T::IQ3_S, T::IQ3_S, T::Q2_K]);
    assert_eq!(at(M::IQ3XS, &m, "blk.5.attn_k.weight", true), T::IQ3_XXS);
    // IQ3_XS: gate and up between the first and last eighth.
    let gate: Vec<BlockType> = (0..16).map(|b| at(M::IQ3XS, &m, &format!("blk.{b}.ffn_gate.weight"), true)).collect();
    let want: Vec<BlockType> = (0..16).map(|b| if (2..14).contains(&b) { T::IQ3_XXS } else { T::IQ3_S }).collect();
    assert_eq!(gate, want);
    // Rows that are not whole super-blocks fall back to IQ4_NL.
    assert_eq!(
        tensor_type(M::IQ2XXS, &m, "blk.5.ffn_up.weight", &[512, 96], true).unwrap(),
        Some(Storage::Block(T::IQ4_NL))
    );
    for t in [T::IQ2_XXS, T::IQ2_XS, T::IQ2_S, T::IQ3_XXS, T::IQ3_S] {
        assert_eq!(fallback(t, 128), Storage::Block(T::IQ4_NL));
        assert_eq!(fallback(t, 80), Storage::Element(Dtype::F16));
    }
}

#[test]
fn iq_mixtures_need_an_importance_matrix_where_llama_quantize_does() {
    use BlockType as T;
    use Mixture as M;
    let block = |t| Storage::Block(t);
    assert!(requires_imatrix(M::IQ2XXS, "blk.0.ffn_up.weight", block(T::IQ2_XXS)));
    assert!(requires_imatrix(M::IQ3M, "blk.0.ffn_up.weight", block(T::IQ3_XXS)));
    assert!(requires_imatrix(M::IQ2M, "blk.0.ffn_up.weight", block(T::IQ2_S)));
    assert!(!requires_imatrix(M::IQ3S, "blk.0.ffn_up.weight", block(T::IQ3_S)));
    assert!(requires_imatrix(M::Q2KS, "blk.0.ffn_up.weight", block(T::Q2_K)));
    assert!(!requires_imatrix(M::Q2K, "blk.0.ffn_up.weight", block(T::Q2_K)));
    assert!(!requires_imatrix(M::IQ2XXS, "token_embd.weight", block(T::IQ2_XXS)));
    assert!(!requires_imatrix(M::IQ2XXS, "output.weight", block(T::IQ2_XS)));
    // Which whole mixtures llama-quantize refuses without one, on a dense model.
    let (m, tensors) = dense16();
    let needs = M::LOW_BIT.map(|mix| {
        tensors
            .iter()
            .any(|(n, s)| tensor_type(mix, &m, n, s, false).unwrap().is_some_and(|st| requires_imatrix(mix, n, st)))
    });
    assert_eq!(needs, [true, true, true, true, true, true, false, false, true]);
}
