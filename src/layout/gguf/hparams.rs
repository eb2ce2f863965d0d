//! The model metadata llama.cpp reads for `qwen35` and `qwen35moe`, from config.json, with the keys,
//! value types and fallbacks llama.cpp's converter uses (its `text_config` values override the
//! top level, as in the converter).

use crate::container::{MetaValue, Metadata};
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};

/// The Hugging Face architectures this layout knows, and llama.cpp's name for each.
const ARCHITECTURES: &[(&str, &str)] = &[
    ("Qwen3_5ForConditionalGeneration", "qwen35"),
    ("Qwen3_5ForCausalLM", "qwen35"),
    ("Qwen3_5MoeForConditionalGeneration", "qwen35moe"),
    ("Qwen3_5MoeForCausalLM", "qwen35moe"),
];

/// The interleaved M-RoPE sections Qwen3.5 uses when the config gives none.
const DEFAULT_MROPE_SECTION: [i32; 4] = [11, 11, 10, 0];

/// The config as the converter reads it: the top level with `text_config` laid over it.
pub struct Hparams {
    values: Map<String, Value>,
    pub arch: &'static str,
}

impl Hparams {
    pub fn new(config: Option<&Value>) -> Result<Hparams> {
        let config = config.context("GGUF output needs the input's config.json")?;
        let mut values = config.as_object().cloned().context("config.json is not an object")?;
        if let Some(text) = config.get("text_config").and_then(Value::as_object) {
            values.extend(text.clone());
        }
        let named: Vec<&str> = config
            .get("architectures")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let Some(&(_, arch)) = ARCHITECTURES.iter().find(|(hf, _)| named.contains(hf)) else {
            bail!(
                "config.json names the architecture {named:?}; GGUF output knows {}",
                ARCHITECTURES.iter().map(|(hf, _)| *hf).collect::<Vec<_>>().join(", ")
            );
        };
        Ok(Hparams { values, arch })
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key).filter(|v| !v.is_null())
    }

    pub fn count(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| format!("config.json: {key} is {v}, not a count"))
            })
            .transpose()
    }

    fn required_u32(&self, key: &str) -> Result<u32> {
        self.count(key)?.with_context(|| format!("config.json has no {key}"))
    }

    fn f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| v.as_f64().map(|x| x as f32).with_context(|| format!("config.json: {key} is {v}, not a number")))
            .transpose()
    }

    /// Transformer blocks before the MTP layers.
    pub fn layers(&self) -> Result<u32> {
        self.required_u32("num_hidden_layers")
    }

    /// The rope parameters: `rope_parameters`, else the older `rope_theta` / `rope_scaling`.
    fn rope(&self) -> Map<String, Value> {
        let mut rope = (self.get("rope_parameters").and_then(Value::as_object))
            .or_else(|| self.get("rope_scaling").and_then(Value::as_object))
            .cloned()
            .unwrap_or_default();
        if let Some(theta) = self.get("rope_theta") {
            rope.entry("rope_theta").or_insert_with(|| theta.clone());
        }
        rope
    }

    /// The model keys, in the order the converter writes them; `mtp_layers` next-token layers
    /// follow the transformer blocks.
    pub fn metadata(&self, mtp_layers: u32, file_type: u32) -> Result<Metadata> {
        let arch = self.arch;
        let key = |k: &str| format!("{arch}.{k}");
        let mut kv: Metadata = Vec::new();
        let layers = self.layers()?;
        let blocks = layers.checked_add(mtp_layers).context("too many layers")?;
        kv.push((key("block_count"), MetaValue::U32(blocks)));
        let push_u32 = |kv: &mut Metadata, name: &str, from: &[&str]| -> Result<()> {
            for f in from {
                if let Some(v) = self.count(f)? {
                    kv.push((key(name), MetaValue::U32(v)));
                    break;
                }
            }
            Ok(())
        };
        push_u32(&mut kv, "context_length", &["max_position_embeddings"])?;
        push_u32(&mut kv, "embedding_length", &["hidden_size"])?;
        push_u32(&mut kv, "feed_forward_length", &["intermediate_size"])?;
        push_u32(&mut kv, "attention.head_count", &["num_attention_heads"])?;
        push_u32(&mut kv, "attention.head_count_kv", &["num_key_value_heads"])?;
        let rope = self.rope();
        scaling(&rope, &mut kv, &key)?;
        let sections: Vec<i32> = match rope.get("mrope_section").and_then(Value::as_array) {
            Some(s) => {
                let mut v: Vec<i32> = s
                    .iter()
                    .map(|x| {
                        x.as_i64()
                            .and_then(|n| i32::try_from(n).ok())
                            .context("config.json: mrope_section holds a non-integer")
                    })
                    .collect::<Result<_>>()?;
                v.resize(4.max(v.len()), 0);
                v.truncate(4);
                v
            }
            None => DEFAULT_MROPE_SECTION.to_vec(),
        };
        kv.push((key("rope.dimension_sections"), MetaValue::I32s(sections)));
        if let Some(theta) = rope.get("rope_theta") {
            let theta = theta.as_f64().context("config.json: rope_theta is not a number")?;
            kv.push((key("rope.freq_base"), MetaValue::F32(theta as f32)));
        }
        if let Some(eps) = self.f32("rms_norm_eps")? {
            kv.push((key("attention.layer_norm_rms_epsilon"), MetaValue::F32(eps)));
        }
        push_u32(&mut kv, "expert_count", &["num_local_experts", "num_experts", "n_routed_experts"])?;
        push_u32(&mut kv, "expert_used_count", &["num_experts_per_tok", "num_experts_per_token", "top_k_experts"])?;
        if let Some(head_dim) = self.count("head_dim")? {
            kv.push((key("attention.key_length"), MetaValue::U32(head_dim)));
            kv.push((key("attention.value_length"), MetaValue::U32(head_dim)));
        }
        kv.push(("general.file_type".into(), MetaValue::U32(file_type)));
        push_u32(&mut kv, "expert_feed_forward_length", &["moe_intermediate_size"])?;
        push_u32(&mut kv, "expert_shared_feed_forward_length", &["shared_expert_intermediate_size"])?;
        let ssm = |k: &str| self.required_u32(k);
        kv.push((key("ssm.conv_kernel"), MetaValue::U32(ssm("linear_conv_kernel_dim")?)));
        kv.push((key("ssm.state_size"), MetaValue::U32(ssm("linear_key_head_dim")?)));
        kv.push((key("ssm.group_count"), MetaValue::U32(ssm("linear_num_key_heads")?)));
        kv.push((key("ssm.time_step_rank"), MetaValue::U32(ssm("linear_num_value_heads")?)));
        let inner = ssm("linear_value_head_dim")?
            .checked_mul(ssm("linear_num_value_heads")?)
            .context("ssm inner size overflows")?;
        kv.push((key("ssm.inner_size"), MetaValue::U32(inner)));
        if let Some(types) = self.get("layer_types") {
            let types = types.as_array().context("config.json: layer_types is not a list")?;
            if types.len() != layers as usize {
                bail!("config.json: layer_types has {} entries, num_hidden_layers is {layers}", types.len());
            }
            let mut recurrent: Vec<bool> = types.iter().map(|t| t.as_str() == Some("linear_attention")).collect();
            recurrent.resize(blocks as usize, false);
            kv.push((key("attention.recurrent_layers"), MetaValue::Bools(recurrent)));
        }
        kv.push((key("full_attention_interval"), MetaValue::U32(self.count("full_attention_interval")?.unwrap_or(4))));
        let head_dim = match self.count("head_dim")? {
            Some(d) => d,
            None => self.required_u32("hidden_size")? / self.required_u32("num_attention_heads")?.max(1),
        };
        let partial = rope.get("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(0.25);
        kv.push((key("rope.dimension_count"), MetaValue::U32((f64::from(head_dim) * partial) as u32)));
        if mtp_layers > 0 {
            kv.push((key("nextn_predict_layers"), MetaValue::U32(mtp_layers)));
        }
        Ok(kv)
    }

    /// The vocabulary size the token list is padded to.
    pub fn vocab_size(&self) -> Result<Option<u32>> {
        self.count("vocab_size")
    }
}

/// The rotary scaling as llama.cpp's converter writes it (`TextModel.set_gguf_parameters`):
/// `rope.scaling.type`, `.factor` and, for `YaRN`, `.original_context_length` (read by the loader of
/// every architecture, qwen35 and qwen35moe among them), and `YaRN`'s betas where the config gives
/// them. A scaling llama.cpp would not run as transformers does is refused, naming llama.cpp.
fn scaling(rope: &Map<String, Value>, kv: &mut Metadata, key: &dyn Fn(&str) -> String) -> Result<()> {
    let kind = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("default");
    let number = |k: &str| rope.get(k).and_then(Value::as_f64);
    let factor = || number("factor").with_context(|| format!("config.json: rope_type {kind:?} without a factor"));
    match kind {
        "default" => {}
        "linear" => {
            kv.push((key("rope.scaling.type"), MetaValue::Str("linear".into())));
            kv.push((key("rope.scaling.factor"), MetaValue::F32(factor()? as f32)));
        }
        "yarn" => {
            // qwen35's loader reads none of YaRN's own keys: it runs betas 32 and 1, and the
            // attention factor of `factor` alone.
            for (k, runs) in [("beta_fast", 32.0), ("beta_slow", 1.0)] {
                if let Some(v) = number(k).filter(|&v| v != runs) {
                    bail!(
                        "config.json: rope {k} is {v}; llama.cpp's qwen35 loader does not read rope.scaling.yarn_{k}                          and runs {runs}, so the GGUF would rotate unlike the model"
                    );
                }
            }
            if rope.contains_key("mscale") || rope.contains_key("mscale_all_dim") {
                bail!(
                    "config.json: rope mscale and mscale_all_dim; llama.cpp's qwen35 loader reads neither and scales                      attention by factor alone, so the GGUF would attend unlike the model"
                );
            }
            let original = rope
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .context("config.json: YaRN without original_max_position_embeddings")?;
            kv.push((key("rope.scaling.type"), MetaValue::Str("yarn".into())));
            kv.push((key("rope.scaling.factor"), MetaValue::F32(factor()? as f32)));
            kv.push((key("rope.scaling.original_context_length"), MetaValue::U32(original)));
            for k in ["beta_fast", "beta_slow"] {
                if let Some(v) = number(k) {
                    kv.push((key(&format!("rope.scaling.yarn_{k}")), MetaValue::F32(v as f32)));
                }
            }
        }
        other => bail!(
            "config.json: rope_type {other:?}; llama.cpp does not run it for qwen35 (its converter writes no scaling              for it and the model would rotate unscaled): convert to another format, or use linear or yarn"
        ),
    }
    Ok(())
}
