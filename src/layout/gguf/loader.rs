//! llama.cpp's load rules for `qwen35` and `qwen35moe`, held against a GGUF plan before anything is
//! written: the keys its loader requires and the bounds it asserts, and every tensor it looks up,
//! with the shape the written keys imply. A plan that breaks one is refused here, naming the key or
//! the tensor, instead of becoming a file llama.cpp refuses or aborts on.
//!
//! The rules follow llama.cpp's `llama_model_base::load_hparams`, the qwen35/qwen35moe
//! `load_arch_hparams` / `load_arch_tensors` and the graph's asserts: the loader creates each
//! tensor it expects (a missing required one, or one of another shape, fails the load) and then
//! requires that it created every tensor in the file (an extra one fails it too). MTP blocks are
//! held to the rules of a load with MTP (`--spec-type draft-mtp`), which requires all of them.

use crate::container::{MetaValue, Metadata};
use crate::layout::{Kind, OutputTensor};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, HashMap, HashSet};

/// llama.cpp's `LLAMA_MAX_LAYERS` and `LLAMA_MAX_EXPERTS`.
const MAX_LAYERS: u32 = 512;
const MAX_EXPERTS: u32 = 1024;
/// The MTP blocks llama.cpp's qwen35 graphs run.
const MAX_NEXTN: u32 = 1;

/// What llama.cpp expects of one tensor: its shape, innermost first as ggml counts, and whether the
/// load fails without it.
struct Expected {
    ne: Vec<u64>,
    required: bool,
    /// The keys the shape comes from, for the message.
    from: &'static str,
}

/// The keys as llama.cpp reads them.
struct Keys<'a> {
    kv: HashMap<&'a str, &'a MetaValue>,
    arch: &'a str,
}

impl<'a> Keys<'a> {
    fn new(kv: &'a Metadata) -> Result<Keys<'a>> {
        let map: HashMap<&str, &MetaValue> = kv.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let Some(MetaValue::Str(arch)) = map.get("general.architecture") else {
            bail!("GGUF: no general.architecture");
        };
        Ok(Keys { kv: map, arch })
    }

    fn get(&self, key: &str) -> Option<&'a MetaValue> {
        self.kv.get(format!("{}.{key}", self.arch).as_str()).copied()
    }

    fn u32(&self, key: &str) -> Option<u32> {
        match self.get(key)? {
            MetaValue::U32(v) => Some(*v),
            _ => None,
        }
    }

    /// A key llama.cpp's loader requires, with the config.json key it is written from.
    fn required(&self, key: &str, config: &str) -> Result<u32> {
        self.u32(key).ok_or_else(|| {
            anyhow::anyhow!(
                "config.json has no {config}: llama.cpp requires {}.{key} and refuses the file without it",
                self.arch
            )
        })
    }

    /// The vocabulary's length: the token list's, else the declared one of a file without a vocabulary.
    fn vocab(&self) -> Option<u64> {
        match self.kv.get("tokenizer.ggml.tokens") {
            Some(MetaValue::Strings(tokens)) => Some(tokens.len() as u64),
            _ => self.u32("vocab_size").map(u64::from),
        }
    }
}

/// The model's sizes as llama.cpp derives them from the keys.
struct Sizes {
    moe: bool,
    embd: u64,
    vocab: Option<u64>,
    layers: u32,
    nextn: u32,
    ff: u64,
    ff_exp: u64,
    ff_shexp: u64,
    experts: u64,
    head: u64,
    head_kv: u64,
    head_dim: u64,
    conv_kernel: u64,
    state: u64,
    k_heads: u64,
    v_heads: u64,
    recurrent: Vec<bool>,
}

fn sizes(keys: &Keys) -> Result<Sizes> {
    let arch = keys.arch;
    let moe = match arch {
        "qwen35" => false,
        "qwen35moe" => true,
        other => bail!("GGUF: no llama.cpp load rules for architecture {other:?}"),
    };
    keys.required("context_length", "max_position_embeddings")?;
    let embd = keys.required("embedding_length", "hidden_size")?;
    let blocks = keys.required("block_count", "num_hidden_layers")?;
    if blocks == 0 || blocks > MAX_LAYERS {
        bail!("GGUF: {blocks} blocks; llama.cpp loads 1 to {MAX_LAYERS}");
    }
    let nextn = keys.u32("nextn_predict_layers").unwrap_or(0);
    if nextn > MAX_NEXTN || nextn >= blocks {
        bail!("GGUF: {nextn} MTP blocks; llama.cpp's {arch} runs at most {MAX_NEXTN} after the transformer blocks");
    }
    let experts = keys.u32("expert_count").unwrap_or(0);
    let used = keys.u32("expert_used_count").unwrap_or(0);
    if experts > MAX_EXPERTS {
        bail!("config.json: {experts} experts; llama.cpp holds at most {MAX_EXPERTS}");
    }
    if used > experts || (experts > 0) != (used > 0) {
        bail!("config.json: {used} experts used per token of {experts}; llama.cpp needs 1 to the expert count (0 without experts)");
    }
    if moe && experts == 0 {
        bail!("config.json has no num_experts: llama.cpp's {arch} needs {arch}.expert_count");
    }
    let head = keys.u32("attention.head_count").unwrap_or(0);
    let head_kv = keys.u32("attention.head_count_kv").unwrap_or(head);
    if head == 0 || head_kv == 0 {
        bail!(
            "config.json: {head} attention heads and {head_kv} key-value heads; llama.cpp's {arch} needs both above 0"
        );
    }
    let head_dim = keys.u32("attention.key_length").unwrap_or(embd / head);
    let value_dim = keys.u32("attention.value_length").unwrap_or(embd / head);
    if head_dim != value_dim {
        bail!("config.json: attention key heads of {head_dim} and value heads of {value_dim}; llama.cpp's {arch} needs them equal");
    }
    let ssm = |key: &str, config: &str| keys.required(key, config);
    let conv_kernel = ssm("ssm.conv_kernel", "linear_conv_kernel_dim")?;
    ssm("ssm.inner_size", "linear_value_head_dim")?;
    let state = ssm("ssm.state_size", "linear_key_head_dim")?;
    let v_heads = ssm("ssm.time_step_rank", "linear_num_value_heads")?;
    let k_heads = ssm("ssm.group_count", "linear_num_key_heads")?;
    if k_heads == 0 || v_heads % k_heads != 0 {
        bail!("config.json: {v_heads} linear-attention value heads do not divide among {k_heads} key heads, as llama.cpp needs");
    }
    match keys.get("attention.layer_norm_rms_epsilon") {
        Some(MetaValue::F32(eps)) if eps.is_finite() && *eps >= 0.0 => {}
        Some(MetaValue::F32(eps)) => {
            bail!("config.json: rms_norm_eps is {eps}; ggml's RMS norm needs a finite value ≥ 0")
        }
        _ => bail!("config.json has no rms_norm_eps: llama.cpp requires {arch}.attention.layer_norm_rms_epsilon"),
    }
    check_rope(keys, head_dim)?;
    let layers = blocks - nextn;
    let recurrent = match keys.get("attention.recurrent_layers") {
        Some(MetaValue::Bools(flags)) if flags.len() == blocks as usize => flags.clone(),
        Some(_) => bail!("GGUF: {arch}.attention.recurrent_layers is not one flag per block"),
        None => {
            let interval = keys.u32("full_attention_interval").unwrap_or(4);
            if interval == 0 {
                bail!("config.json: full_attention_interval is 0; llama.cpp divides by it");
            }
            (0..blocks).map(|i| i < layers && (i + 1) % interval != 0).collect()
        }
    };
    if recurrent[layers as usize..].iter().any(|&r| r) {
        bail!("GGUF: an MTP block is marked as linear attention; llama.cpp's MTP blocks are full attention");
    }
    // llama.cpp's hybrid memory gives the recurrent state and the KV cache a buffer only when some
    // layer has one; with none of either kind, the first decode aborts (`GGML_ASSERT(buffer)`).
    let linear = recurrent[..layers as usize].iter().filter(|&&r| r).count();
    if linear == 0 || linear == layers as usize {
        let missing = if linear == 0 { "linear-attention" } else { "full-attention" };
        bail!(
            "config.json: no {missing} layer (full_attention_interval {}); llama.cpp's {arch} runs only models with \
             both kinds of layer, and aborts on the first token without",
            keys.u32("full_attention_interval").unwrap_or(4)
        );
    }
    let ff = keys.u32("feed_forward_length").unwrap_or(0);
    let ff_exp = match keys.u32("expert_feed_forward_length").unwrap_or(0) {
        0 if used > 0 => ff / used,
        n => n,
    };
    let ff_shexp = match keys.u32("expert_shared_feed_forward_length").unwrap_or(0) {
        0 => ff,
        n => n,
    };
    let wide = u64::from;
    Ok(Sizes {
        moe,
        embd: wide(embd),
        vocab: keys.vocab(),
        layers,
        nextn,
        ff: wide(ff),
        ff_exp: wide(ff_exp),
        ff_shexp: wide(ff_shexp),
        experts: wide(experts),
        head: wide(head),
        head_kv: wide(head_kv),
        head_dim: wide(head_dim),
        conv_kernel: wide(conv_kernel),
        state: wide(state),
        k_heads: wide(k_heads),
        v_heads: wide(v_heads),
        recurrent,
    })
}

/// What ggml's rope asserts of the rotated dimensions (`rope.dimension_count`, even and at most the
/// head size) and of the M-RoPE sections (one at least non-zero, all within the head), and a base
/// frequency that gives finite angles.
fn check_rope(keys: &Keys, head_dim: u32) -> Result<()> {
    let n_rot = keys.u32("rope.dimension_count").unwrap_or(head_dim);
    if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
        bail!(
            "config.json: partial_rotary_factor rotates {n_rot} of the head's {head_dim} dimensions; ggml's rope needs an even count above 0 within the head"
        );
    }
    if let Some(MetaValue::I32s(sections)) = keys.get("rope.dimension_sections") {
        let sum: i64 = sections.iter().map(|&s| i64::from(s)).sum();
        if sections.iter().any(|&s| s < 0) || sections.iter().all(|&s| s == 0) || sum > i64::from(head_dim) {
            bail!(
                "config.json: mrope_section {sections:?}; ggml's M-RoPE needs non-negative sections, one above 0, summing to at most the head's {head_dim} dimensions"
            );
        }
    }
    // llama.cpp asserts a scaling type it knows (`llama_rope_scaling_type_from_string`).
    match keys.get("rope.scaling.type") {
        None => {}
        Some(MetaValue::Str(t)) if ["none", "linear", "yarn", "longrope"].contains(&t.as_str()) => {}
        Some(t) => bail!("GGUF: rope.scaling.type is {t:?}; llama.cpp aborts on a type it does not know"),
    }
    match keys.get("rope.freq_base") {
        Some(MetaValue::F32(theta)) if !theta.is_finite() || *theta <= 0.0 => {
            bail!("config.json: rope_theta is {theta}; rope needs a finite base above 0")
        }
        _ => Ok(()),
    }
}

/// Every tensor llama.cpp looks up in a file of `s`, by name.
fn expected(s: &Sizes) -> BTreeMap<String, Expected> {
    let mut out = BTreeMap::new();
    let mut put = |name: String, ne: &[u64], required: bool, from: &'static str| {
        out.insert(name, Expected { ne: ne.to_vec(), required, from });
    };
    let embd = s.embd;
    let vocab = s.vocab.unwrap_or(0);
    // Sizes of counts up to 2^32 each; a product beyond u64 matches no tensor either.
    let mul = u64::saturating_mul;
    let (q, kv) = (mul(s.head_dim, s.head), mul(s.head_dim, s.head_kv));
    put("token_embd.weight".into(), &[embd, vocab], true, "embedding_length, the vocabulary");
    put("output_norm.weight".into(), &[embd], true, "embedding_length");
    put("output.weight".into(), &[embd, vocab], false, "embedding_length, the vocabulary");
    for il in 0..s.layers + s.nextn {
        let blk = |leaf: &str| format!("blk.{il}.{leaf}");
        let mtp = il >= s.layers;
        put(blk("attn_norm.weight"), &[embd], true, "embedding_length");
        put(blk("post_attention_norm.weight"), &[embd], true, "embedding_length");
        if s.recurrent[il as usize] {
            let (key_dim, value_dim) = (mul(s.state, s.k_heads), mul(s.state, s.v_heads));
            let conv = mul(2, key_dim).saturating_add(value_dim);
            let from = "embedding_length, ssm.state_size, ssm.group_count, ssm.time_step_rank";
            put(blk("attn_qkv.weight"), &[embd, conv], true, from);
            put(blk("attn_gate.weight"), &[embd, value_dim], true, from);
            put(blk("ssm_conv1d.weight"), &[s.conv_kernel, conv], true, from);
            put(blk("ssm_dt.bias"), &[s.v_heads], true, "ssm.time_step_rank");
            put(blk("ssm_a"), &[s.v_heads], true, "ssm.time_step_rank");
            put(blk("ssm_beta.weight"), &[embd, s.v_heads], true, from);
            put(blk("ssm_alpha.weight"), &[embd, s.v_heads], true, from);
            put(blk("ssm_norm.weight"), &[s.state], true, "ssm.state_size");
            put(blk("ssm_out.weight"), &[value_dim, embd], true, from);
        } else {
            let from = "embedding_length, attention.head_count(_kv), attention.key_length";
            put(blk("attn_q.weight"), &[embd, mul(2, q)], true, from);
            put(blk("attn_k.weight"), &[embd, kv], true, from);
            put(blk("attn_v.weight"), &[embd, kv], true, from);
            put(blk("attn_q.bias"), &[mul(2, q)], false, from);
            put(blk("attn_k.bias"), &[kv], false, from);
            put(blk("attn_v.bias"), &[kv], false, from);
            put(blk("attn_output.weight"), &[q, embd], true, from);
            put(blk("attn_q_norm.weight"), &[s.head_dim], true, "attention.key_length");
            put(blk("attn_k_norm.weight"), &[s.head_dim], true, "attention.key_length");
        }
        if s.moe {
            let from = "embedding_length, expert_count, expert_feed_forward_length";
            put(blk("ffn_gate_inp.weight"), &[embd, s.experts], true, from);
            put(blk("ffn_down_exps.weight"), &[s.ff_exp, embd, s.experts], true, from);
            put(blk("ffn_gate_exps.weight"), &[embd, s.ff_exp, s.experts], true, from);
            put(blk("ffn_up_exps.weight"), &[embd, s.ff_exp, s.experts], true, from);
            let from = "embedding_length, expert_shared_feed_forward_length";
            put(blk("ffn_gate_inp_shexp.weight"), &[embd], true, "embedding_length");
            put(blk("ffn_gate_shexp.weight"), &[embd, s.ff_shexp], true, from);
            put(blk("ffn_up_shexp.weight"), &[embd, s.ff_shexp], true, from);
            put(blk("ffn_down_shexp.weight"), &[s.ff_shexp, embd], true, from);
        } else {
            let from = "embedding_length, feed_forward_length";
            put(blk("ffn_gate.weight"), &[embd, s.ff], true, from);
            put(blk("ffn_up.weight"), &[embd, s.ff], true, from);
            put(blk("ffn_down.weight"), &[s.ff, embd], true, from);
        }
        if mtp {
            put(blk("nextn.eh_proj.weight"), &[mul(2, embd), embd], true, "embedding_length");
            put(blk("nextn.enorm.weight"), &[embd], true, "embedding_length");
            put(blk("nextn.hnorm.weight"), &[embd], true, "embedding_length");
            put(blk("nextn.embed_tokens.weight"), &[embd, vocab], false, "embedding_length, the vocabulary");
            put(blk("nextn.shared_head_head.weight"), &[embd, vocab], false, "embedding_length, the vocabulary");
            put(blk("nextn.shared_head_norm.weight"), &[embd], false, "embedding_length");
        }
    }
    out
}

/// Refuses a plan llama.cpp would not load: `kv` are the keys to be written, `tensors` every
/// tensor of the whole conversion (shapes outermost first).
pub fn check(kv: &Metadata, tensors: &[OutputTensor]) -> Result<()> {
    let keys = Keys::new(kv)?;
    let s = sizes(&keys)?;
    let expected = expected(&s);
    let arch = keys.arch;
    let mut present = HashSet::with_capacity(tensors.len());
    for t in tensors {
        let ne = trimmed(t.shape.iter().rev().map(|&d| d as u64).collect());
        let Some(e) = expected.get(&t.name) else {
            let way_out =
                if t.kind == Kind::Bias { "; --bias drop leaves the biases of coded linears out" } else { "" };
            bail!(
                "tensor {}: llama.cpp's {arch} has no place for it and refuses a file holding it (\"wrong number of tensors\"){}{way_out}",
                t.name,
                block_kind(&t.name, &s)
            );
        };
        // A file without a vocabulary cannot be held to one.
        let vocab_free = s.vocab.is_none() && e.from.ends_with("the vocabulary");
        if trimmed(e.ne.clone()) != ne && !(vocab_free && e.ne[0] == ne[0] && ne.len() == 2) {
            bail!(
                "tensor {}: shape {} (ggml order), but the written hyperparameters ({}) make llama.cpp expect {}; \
                 config.json does not describe these tensors",
                t.name,
                dims(&ne),
                e.from,
                dims(&e.ne)
            );
        }
        present.insert(t.name.as_str());
    }
    if let Some((name, e)) = expected.iter().find(|(n, e)| e.required && !present.contains(n.as_str())) {
        bail!("no tensor {name} {}: llama.cpp's {arch} requires it{}", dims(&e.ne), block_kind(name, &s));
    }
    Ok(())
}

/// What config.json makes of the block tensor `name` belongs to, for a message.
fn block_kind(name: &str, s: &Sizes) -> String {
    let block = name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|b| b.parse::<u32>().ok());
    match block {
        Some(b) if b >= s.layers + s.nextn => String::new(),
        Some(b) if b >= s.layers => " (the MTP head is incomplete: --mtp drop writes none)".to_string(),
        Some(b) if s.recurrent[b as usize] => format!(" (block {b} is linear attention in config.json)"),
        Some(b) => format!(" (block {b} is full attention in config.json)"),
        None => String::new(),
    }
}

/// A ggml shape without its trailing 1s: llama.cpp takes `[n, 1]` for `[n]`.
fn trimmed(mut ne: Vec<u64>) -> Vec<u64> {
    while ne.len() > 1 && ne.last() == Some(&1) {
        ne.pop();
    }
    ne
}

fn dims(ne: &[u64]) -> String {
    format!("[{}]", ne.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
}
