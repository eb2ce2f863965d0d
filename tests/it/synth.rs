//! Synthetic checkpoints for the conversion tests: small, valid Escha-W2 files with random codes,
//! an independent f64 reconstruction to compare against, and ways to break them.
#![allow(dead_code)]

use escha_convert::rng::SplitMix64;
use half::{bf16, f16};
use serde_json::json;
use std::path::{Path, PathBuf};

/// A tensor to write: name, safetensors dtype string, shape, little-endian bytes.
#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl T {
    pub fn new(name: &str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> T {
        T { name: name.into(), dtype, shape: shape.to_vec(), data }
    }
    pub fn f16(name: &str, shape: &[usize], v: &[f32]) -> T {
        T::new(name, "F16", shape, v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect())
    }
    pub fn f32(name: &str, shape: &[usize], v: &[f32]) -> T {
        T::new(name, "F32", shape, v.iter().flat_map(|&x| x.to_le_bytes()).collect())
    }
    pub fn i32(name: &str, v: &[i32]) -> T {
        T::new(name, "I32", &[v.len()], v.iter().flat_map(|&x| x.to_le_bytes()).collect())
    }
}

/// Writes a safetensors file with tensors in the given order (header JSON written by hand so
/// tests can also write broken ones).
pub fn write_safetensors(path: &Path, tensors: &[T]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}),
        );
        offset += t.data.len();
    }
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    for t in tensors {
        bytes.extend_from_slice(&t.data);
    }
    std::fs::write(path, bytes).unwrap();
}

/// The crate's deterministic generator, with what these tests draw from it.
pub struct Rng(SplitMix64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64(seed))
    }
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

/// The tensors of one coded linear `P` (dense when `experts` is None).
#[allow(clippy::too_many_arguments)] // each is one dimension of the test matrix
pub fn coded_linear(
    rng: &mut Rng,
    path: &str,
    experts: Option<usize>,
    ic: usize,
    oc: usize,
    k: u32,
    with_s: bool,
    bias: bool,
) -> Vec<T> {
    let e = experts.unwrap_or(1);
    let lead: Vec<usize> = experts.into_iter().collect();
    let shape = |rest: &[usize]| -> Vec<usize> { lead.iter().chain(rest).copied().collect() };
    let mut out = vec![
        T::new(
            &format!("{path}.escha_code"),
            "I16",
            &shape(&[ic / 16, oc / 16, 16 * k as usize]),
            rng.bytes(e * ic * oc * k as usize / 8),
        ),
        T::f16(&format!("{path}.escha_rin"), &shape(&[ic]), &rng.vec(e * ic, -0.02, 0.02)),
        T::f16(&format!("{path}.escha_rout"), &shape(&[oc]), &rng.vec(e * oc, -1.2, 1.2)),
    ];
    if with_s {
        out.push(T::f32(&format!("{path}.escha_s_in"), &shape(&[ic]), &rng.vec(e * ic, 0.98, 1.02)));
        out.push(T::f32(&format!("{path}.escha_s_out"), &shape(&[oc]), &rng.vec(e * oc, 0.98, 1.02)));
    }
    let config: Vec<i32> = match experts {
        None => vec![16, k as i32, 2, 1, ic as i32, oc as i32],
        Some(n) => vec![16, k as i32, 2, 1, n as i32, ic as i32, oc as i32, ic as i32, oc as i32],
    };
    out.push(T::i32(&format!("{path}.escha_config"), &config));
    if bias {
        out.push(T::f16(&format!("{path}.bias"), &shape(&[oc]), &rng.vec(e * oc, -0.01, 0.01)));
    }
    out
}

/// A small valid checkpoint of [`Model::small`]: three coded linears (the shared expert's
/// `up_proj` with `s_in/s_out` and bias, the linear attention's `out_proj`, a stack of three
/// experts), an int8 embedding, norms, an F32 plain tensor, and every other tensor the model needs
/// as plain zeros.
pub fn small_checkpoint(seed: u64) -> Vec<T> {
    let mut rng = Rng::new(seed);
    let p = "model.language_model.layers.0";
    let mut t = Vec::new();
    t.extend(coded_linear(&mut rng, &format!("{p}.mlp.shared_expert.up_proj"), None, 256, 384, 3, true, true));
    t.extend(coded_linear(&mut rng, &format!("{p}.linear_attn.out_proj"), None, 128, 256, 2, false, false));
    t.extend(coded_linear(&mut rng, &format!("{p}.mlp.experts.gate_up_proj"), Some(3), 256, 256, 2, true, false));
    let (vocab, hidden) = (40, 256);
    let w8: Vec<u8> = rng.bytes(vocab * hidden);
    t.push(T::new("model.language_model.embed_tokens.weight_int8", "I8", &[vocab, hidden], w8));
    t.push(T::f16("model.language_model.embed_tokens.weight_scale", &[vocab], &rng.vec(vocab, 0.001, 0.01)));
    t.push(T::f16(&format!("{p}.input_layernorm.weight"), &[256], &rng.vec(256, -0.1, 0.1)));
    t.push(T::f16(&format!("{p}.linear_attn.norm.weight"), &[128], &rng.vec(128, 0.9, 1.1)));
    t.push(T::f32(&format!("{p}.linear_attn.A_log"), &[1], &rng.vec(1, -1.0, 1.0)));
    t.push(T::new(
        &format!("{p}.linear_attn.conv1d.weight"),
        "BF16",
        &[256, 1, 4],
        rng.vec(1024, -1.0, 1.0).iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
    ));
    Model::small().complete(&mut t);
    t
}

/// A checkpoint that takes a second or two to convert with the scalar decoder on one thread:
/// 50M coded weights (K=1) in the 32 wide experts of one Qwen3.5-MoE layer, everything else small.
pub fn slow_checkpoint(dir: &Path, seed: u64) -> PathBuf {
    let mut rng = Rng::new(seed);
    let model = Model { experts: Some((32, 4096, 128)), ..Model::dense(128, 1) };
    let p = "model.language_model.layers.0.mlp.experts";
    let mut t = coded_linear(&mut rng, &format!("{p}.gate_up_proj"), Some(32), 128, 8192, 1, false, false);
    t.extend(coded_linear(&mut rng, &format!("{p}.down_proj"), Some(32), 4096, 128, 1, false, false));
    write_model(dir, &t, &model)
}

/// The config.json of [`small_checkpoint`].
pub fn config_json() -> serde_json::Value {
    Model::small().config()
}

/// A tiny Qwen3.5 text model, coherent: the sizes its config.json declares and every tensor they
/// imply (transformers' `Qwen3_5*` / `Qwen3_5Moe*` shapes).
#[derive(Clone, Debug)]
pub struct Model {
    pub hidden: usize,
    /// `linear_attention` or `full_attention`, one per layer.
    pub layer_types: Vec<&'static str>,
    pub vocab: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Linear attention: key heads, key head size, value heads, value head size.
    pub linear: [usize; 4],
    pub conv_kernel: usize,
    /// The dense MLP's width (dense Qwen3.5).
    pub intermediate: usize,
    /// Routed experts (Qwen3.5-MoE): count, width, shared expert's width.
    pub experts: Option<(usize, usize, usize)>,
    /// `model.language_model.` or `model.`.
    pub prefix: &'static str,
}

impl Model {
    /// The model of [`small_checkpoint`]: one linear-attention layer of a Qwen3.5-MoE, hidden 256.
    pub fn small() -> Model {
        Model {
            hidden: 256,
            layer_types: vec!["linear_attention"],
            vocab: 40,
            heads: 2,
            kv_heads: 1,
            head_dim: 128,
            linear: [1, 64, 1, 128],
            conv_kernel: 4,
            intermediate: 512,
            experts: Some((3, 128, 384)),
            prefix: "model.language_model.",
        }
    }

    /// A dense Qwen3.5 of `layers` linear-attention layers whose every linear is `width` wide
    /// (hidden size and MLP width alike).
    pub fn dense(width: usize, layers: usize) -> Model {
        Model {
            hidden: width,
            layer_types: vec!["linear_attention"; layers],
            vocab: 16,
            heads: 1,
            kv_heads: 1,
            head_dim: 128,
            linear: [1, 64, 1, 128],
            conv_kernel: 4,
            intermediate: width,
            experts: None,
            prefix: "model.language_model.",
        }
    }

    pub fn config(&self) -> serde_json::Value {
        let [kh, kd, vh, vd] = self.linear;
        let mut text = json!({
            "model_type": if self.experts.is_some() { "qwen3_5_moe_text" } else { "qwen3_5_text" },
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layer_types.len(),
            "layer_types": self.layer_types,
            "vocab_size": self.vocab,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": kh,
            "linear_key_head_dim": kd,
            "linear_num_value_heads": vh,
            "linear_value_head_dim": vd,
            "linear_conv_kernel_dim": self.conv_kernel,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
            "tie_word_embeddings": false
        });
        match self.experts {
            Some((e, i, s)) => {
                text["num_experts"] = json!(e);
                text["num_experts_per_tok"] = json!(e.min(2));
                text["moe_intermediate_size"] = json!(i);
                text["shared_expert_intermediate_size"] = json!(s);
            }
            None => text["intermediate_size"] = json!(self.intermediate),
        }
        let (model_type, arch) = match self.experts {
            Some(_) => ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"),
            None => ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
        };
        json!({
            "architectures": [arch],
            "model_type": model_type,
            "text_config": text,
            "quantization_config": {"quant_method": "escha", "bits": 2.0},
            "tie_word_embeddings": false
        })
    }

    /// Every tensor the model needs, by Hugging Face name (a linear as `P.weight`, stacked experts
    /// without a suffix), with its shape.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, v) = (self.hidden, self.vocab);
        let [kh, kd, vh, vd] = self.linear;
        let (key, value) = (kh * kd, vh * vd);
        let conv = 2 * key + value;
        let mut out = vec![
            (format!("{}embed_tokens.weight", self.prefix), vec![v, h]),
            (format!("{}norm.weight", self.prefix), vec![h]),
            ("lm_head.weight".to_string(), vec![v, h]),
        ];
        for (i, t) in self.layer_types.iter().enumerate() {
            let l = format!("{}layers.{i}.", self.prefix);
            let mut put = |leaf: &str, shape: Vec<usize>| out.push((format!("{l}{leaf}"), shape));
            put("input_layernorm.weight", vec![h]);
            put("post_attention_layernorm.weight", vec![h]);
            if *t == "linear_attention" {
                put("linear_attn.in_proj_qkv.weight", vec![conv, h]);
                put("linear_attn.in_proj_z.weight", vec![value, h]);
                put("linear_attn.in_proj_b.weight", vec![vh, h]);
                put("linear_attn.in_proj_a.weight", vec![vh, h]);
                put("linear_attn.conv1d.weight", vec![conv, 1, self.conv_kernel]);
                put("linear_attn.dt_bias", vec![vh]);
                put("linear_attn.A_log", vec![vh]);
                put("linear_attn.norm.weight", vec![vd]);
                put("linear_attn.out_proj.weight", vec![h, value]);
            } else {
                let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
                put("self_attn.q_proj.weight", vec![2 * q, h]);
                put("self_attn.k_proj.weight", vec![kv, h]);
                put("self_attn.v_proj.weight", vec![kv, h]);
                put("self_attn.o_proj.weight", vec![h, q]);
                put("self_attn.q_norm.weight", vec![self.head_dim]);
                put("self_attn.k_norm.weight", vec![self.head_dim]);
            }
            if let Some((e, m, s)) = self.experts {
                put("mlp.gate.weight", vec![e, h]);
                put("mlp.experts.gate_up_proj", vec![e, 2 * m, h]);
                put("mlp.experts.down_proj", vec![e, h, m]);
                put("mlp.shared_expert.gate_proj.weight", vec![s, h]);
                put("mlp.shared_expert.up_proj.weight", vec![s, h]);
                put("mlp.shared_expert.down_proj.weight", vec![h, s]);
                put("mlp.shared_expert_gate.weight", vec![1, h]);
            } else {
                let m = self.intermediate;
                put("mlp.gate_proj.weight", vec![m, h]);
                put("mlp.up_proj.weight", vec![m, h]);
                put("mlp.down_proj.weight", vec![h, m]);
            }
        }
        out
    }

    /// Adds, as plain zeros (F16; F32 for `A_log`), every tensor the model needs that `tensors`
    /// hold in no form (plain, coded, int8, or per-expert linears).
    pub fn complete(&self, tensors: &mut Vec<T>) {
        let names: std::collections::HashSet<String> = tensors.iter().map(|t| t.name.clone()).collect();
        let held = |name: &str| {
            let module = name.strip_suffix(".weight").unwrap_or(name);
            let split = name
                .strip_suffix(".gate_up_proj")
                .or_else(|| name.strip_suffix(".down_proj"))
                .filter(|p| p.ends_with(".experts"));
            names.contains(name)
                || ["escha_code", "trellis", "weight_int8"]
                    .iter()
                    .any(|leaf| names.contains(&format!("{module}.{leaf}")))
                || split.is_some_and(|p| names.iter().any(|n| n.starts_with(&format!("{p}.0."))))
        };
        for (name, shape) in self.tensors() {
            if held(&name) {
                continue;
            }
            let n: usize = shape.iter().product();
            if name.ends_with(".A_log") {
                tensors.push(T::f32(&name, &shape, &vec![0.0; n]));
            } else {
                tensors.push(T::f16(&name, &shape, &vec![0.0; n]));
            }
        }
    }
}

/// Writes `tensors` as they are (a [`small_checkpoint`], or one broken on purpose) as a one-shard
/// checkpoint directory with its config.json and side files.
pub fn write_checkpoint(dir: &Path, tensors: &[T]) -> PathBuf {
    write_files(dir, tensors, &Model::small())
}

/// Writes `tensors`, completed to `model`, as a one-shard checkpoint directory with `model`'s
/// config.json and side files.
pub fn write_model(dir: &Path, tensors: &[T], model: &Model) -> PathBuf {
    let mut tensors = tensors.to_vec();
    model.complete(&mut tensors);
    write_files(dir, &tensors, model)
}

fn write_files(dir: &Path, tensors: &[T], model: &Model) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&model.config()).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "{\"model_max_length\": 4096}\n").unwrap();
    std::fs::write(dir.join("quantize_config.json"), "{\"quant_method\": \"escha\"}\n").unwrap();
    dir.to_path_buf()
}

/// Tensors by name: dtype, shape and bytes.
pub type Tensors = std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

/// Every tensor of the safetensors files directly in `dir`.
pub fn read_dir_safetensors(dir: &Path) -> Tensors {
    let mut all = Tensors::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            all.extend(read_safetensors(&p));
        }
    }
    all
}

/// Reads every tensor of a safetensors file: name → (dtype, shape, bytes).
pub fn read_safetensors(path: &Path) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for (name, info) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let off = info["data_offsets"].as_array().unwrap();
        let (a, b) = (off[0].as_u64().unwrap() as usize, off[1].as_u64().unwrap() as usize);
        let shape = info["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        out.insert(
            name.clone(),
            (info["dtype"].as_str().unwrap().to_string(), shape, bytes[8 + n + a..8 + n + b].to_vec()),
        );
    }
    out
}

/// Decodes f16 little-endian bytes.
pub fn f16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}
pub fn bf16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

/// Independent f64 reconstruction of one linear `[OC, IC]` from its code bytes and vectors:
/// tile states and values from the documented formulas, then explicit Hadamard products.
pub fn reference_linear(code: &[u8], ic: usize, oc: usize, k: u32, su: &[f64], sv: &[f64]) -> Vec<f64> {
    reference_linear_with(escha_convert::codec::Codebook::Mcg, code, ic, oc, k, su, sv)
}

/// [`reference_linear`] with any codebook.
pub fn reference_linear_with(
    cb: escha_convert::codec::Codebook,
    code: &[u8],
    ic: usize,
    oc: usize,
    k: u32,
    su: &[f64],
    sv: &[f64],
) -> Vec<f64> {
    use escha_convert::codec::PERM;
    let (it, ot) = (ic / 16, oc / 16);
    let tile_bytes = 32 * k as usize;
    let mut inner = vec![0f64; ic * oc];
    for i in 0..it {
        for j in 0..ot {
            let tile = &code[(i * ot + j) * tile_bytes..][..tile_bytes];
            let bit = |p: usize| -> u32 {
                let w = u16::from_le_bytes([tile[2 * ((p >> 4) ^ 1)], tile[2 * ((p >> 4) ^ 1) + 1]]);
                ((w >> (15 - (p & 15))) & 1) as u32
            };
            let total = 256 * k as usize;
            for (t, &p) in PERM.iter().enumerate() {
                let mut state = 0u32;
                for b in 0..16 {
                    state = (state << 1) | bit(((t + 1) * k as usize + total - 16 + b) % total);
                }
                let v = cb.value(state as u16) as f64;
                let p = p as usize;
                inner[(16 * i + p / 16) * oc + 16 * j + p % 16] = v;
            }
        }
    }
    let h = |a: usize, b: usize| -> f64 {
        let s = if ((a % 128) & (b % 128)).count_ones().is_multiple_of(2) { 1.0 } else { -1.0 };
        s / (128f64).sqrt()
    };
    let mut left = vec![0f64; oc * ic]; // Hn · W_innerᵀ
    for o in 0..oc {
        for p in (o / 128) * 128..(o / 128 + 1) * 128 {
            for i in 0..ic {
                left[o * ic + i] += h(o, p) * inner[i * oc + p];
            }
        }
    }
    let mut w = vec![0f64; oc * ic];
    for o in 0..oc {
        for i in 0..ic {
            let acc: f64 = ((i / 128) * 128..(i / 128 + 1) * 128).map(|q| left[o * ic + q] * h(q, i)).sum();
            w[o * ic + i] = sv[o] * acc * su[i];
        }
    }
    w
}

/// Asserts `got` (bf16) is `want` (f64) correctly rounded, except where `want` lies so close to a
/// rounding tie (within 1e-6 of the tensor's largest magnitude, the f32 reconstruction's error)
/// that f32 and f64 arithmetic may legitimately round apart.
pub fn assert_bf16_rounding_of(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tolerance = 1e-6 * want.iter().fold(0f64, |m, w| m.max(w.abs()));
    let mut near_ties = 0;
    for (n, (&g, &w)) in got.iter().zip(want).enumerate() {
        let r = bf16::from_f64(w).to_f32();
        if g == r {
            continue;
        }
        let ulp = (bf16::from_f32(r).to_f32() - bf16::from_bits(bf16::from_f32(r).to_bits() - 1).to_f32()).abs() as f64;
        let tie_distance = ((w - g as f64).abs() - ulp / 2.0).abs();
        assert!(tie_distance < tolerance, "{what}[{n}]: got {g}, want {w} (rounds to {r})");
        near_ties += 1;
    }
    assert!(near_ties * 1000 <= got.len(), "{what}: {near_ties} near-tie disagreements is too many");
}

/// Rewrites every safetensors file directly in `dir` (a copy of a fixture): `edit` may change a
/// tensor's dtype, shape or bytes, or return false to leave it out (and out of the index).
pub fn edit_tensors(dir: &Path, mut edit: impl FnMut(&str, &mut T) -> bool) {
    let mut gone = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let mut kept = Vec::new();
        for (name, (dtype, shape, data)) in read_safetensors(&p) {
            let mut t = T::new(&name, Box::leak(dtype.into_boxed_str()), &shape, data);
            if edit(&name, &mut t) {
                kept.push(t);
            } else {
                gone.push(name);
            }
        }
        write_safetensors(&p, &kept);
    }
    let index = dir.join("model.safetensors.index.json");
    if !gone.is_empty() && index.is_file() {
        let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        let map = json["weight_map"].as_object_mut().unwrap();
        for name in &gone {
            map.shift_remove(name);
        }
        std::fs::write(&index, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    }
}
