//! Every tensor in its place: each scope (the model's top, a decoder layer, an MTP layer) holds
//! the tensors the config gives it, of the shapes it implies, and nothing else.

use super::expected::{is_any_float, layer_tensors, top_tensors, Logical, Source};
use super::model::{LayerType, TextModel};
use crate::checkpoint::input::Checkpoint;
use crate::checkpoint::modules::Catalog;
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// Where a tensor belongs: a decoder layer, an MTP layer, or the model's top.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Top,
    Layer(u64),
    MtpLayer(u64),
}

/// The text-model prefix the tensors use: `model.language_model.` when any tensor has it, else
/// `model.`.
fn prefix(ck: &Checkpoint) -> &'static str {
    if ck.tensors.keys().any(|n| n.starts_with("model.language_model.")) {
        "model.language_model."
    } else {
        "model."
    }
}

pub(super) fn check_tensors(ck: &Checkpoint, cat: &Catalog, model: &TextModel) -> Result<()> {
    let prefix = prefix(ck);
    let all = logical(ck, cat);
    let mut by_scope: BTreeMap<Scope, Vec<&Logical>> = BTreeMap::new();
    for t in &all {
        let scope = match scope_of(&t.name, prefix, model) {
            Ok(s) => s,
            Err(why) => bail!("{}: {why}", t.describe()),
        };
        by_scope.entry(scope).or_default().push(t);
    }
    // A layer the config does not announce first: a stray index is named as such, whatever else.
    let layers = model.layer_types.len() as u64;
    for (scope, tensors) in &by_scope {
        let why = match *scope {
            Scope::Layer(i) if i >= layers => format!(
                "layer {i}, but config.json's num_hidden_layers is {layers}: a stray layer the model has no place for"
            ),
            Scope::MtpLayer(i) if i >= model.mtp_layers => format!(
                "MTP layer {i}, but config.json's mtp_num_hidden_layers is {}: a stray layer the head has no place for",
                model.mtp_layers
            ),
            _ => continue,
        };
        bail!("{}: {why}", tensors[0].describe());
    }
    let none = Vec::new();
    for scope in [Scope::Top].into_iter().chain((0..layers).map(Scope::Layer)) {
        check_scope(scope, by_scope.get(&scope).unwrap_or(&none), prefix, model)?;
    }
    // The MTP layers the tensors hold: the count in the config is only a claim (it may be huge).
    for (scope, present) in by_scope.iter().filter(|(s, _)| matches!(s, Scope::MtpLayer(_))) {
        check_scope(*scope, present, prefix, model)?;
    }
    Ok(())
}

/// The input's tensors as the model sees them: a coded linear as its weight, an int8 pair as its
/// weight, every plain tensor as itself; the vision tower is left out (dropped and reported).
fn logical<'a>(ck: &'a Checkpoint, cat: &'a Catalog) -> Vec<Logical<'a>> {
    let mut out = Vec::new();
    for m in &cat.coded {
        let code = m.tensor(crate::checkpoint::modules::Leaf::Code).unwrap_or(&m.path);
        let (name, shape) = match m.experts {
            None => (format!("{}.weight", m.path), vec![m.out_features, m.in_features]),
            Some(e) => (m.path.clone(), vec![e, m.out_features, m.in_features]),
        };
        out.push(Logical { name, shape, source: Source::Coded(code) });
    }
    for m in &cat.int8 {
        out.push(Logical {
            name: format!("{}.weight", m.path),
            shape: m.shape.clone(),
            source: Source::Int8(&m.weight),
        });
    }
    for p in &cat.plain {
        let e = &ck.tensors[&p.name];
        out.push(Logical { name: p.name.clone(), shape: e.shape.clone(), source: Source::Plain(e.dtype) });
    }
    out
}

/// The scope of a tensor name, or why it has none.
fn scope_of(name: &str, prefix: &str, model: &TextModel) -> std::result::Result<Scope, String> {
    let index = |rest: &str| rest.split('.').next().and_then(|i| i.parse::<u64>().ok());
    if let Some(rest) = name.strip_prefix(prefix) {
        if let Some(rest) = rest.strip_prefix("layers.") {
            return index(rest).map(Scope::Layer).ok_or_else(|| "a layer without a layer index".to_string());
        }
        return Ok(Scope::Top);
    }
    if name.starts_with("lm_head.") {
        return Ok(Scope::Top);
    }
    if let Some(rest) = name.strip_prefix("mtp.") {
        if model.mtp_layers == 0 {
            // No head announced: the MTP rule drops it (or keeps it with a warning).
            return Ok(Scope::Top);
        }
        if let Some(rest) = rest.strip_prefix("layers.") {
            return index(rest).map(Scope::MtpLayer).ok_or_else(|| "an MTP layer without a layer index".to_string());
        }
        return Ok(Scope::Top);
    }
    let other = if prefix == "model." { "model.language_model." } else { "model." };
    if name.starts_with(other) {
        return Err(format!(
            "named under {other} while the model's other tensors are under {prefix}: one model uses one layout"
        ));
    }
    Err(format!("no place in a {} model (its tensors are {prefix}…, lm_head and mtp.…)", model.model_type))
}

/// Checks the tensors of one scope against what the config makes of it.
fn check_scope(scope: Scope, present: &[&Logical], prefix: &str, model: &TextModel) -> Result<()> {
    let split_experts = |base: &str| present.iter().any(|t| expert_index(&t.name, base).is_some());
    let (expected, what) = match scope {
        Scope::Top => (top_tensors(prefix, model, present), "the model".to_string()),
        Scope::Layer(i) => {
            let base = format!("{prefix}layers.{i}.");
            let split = split_experts(&format!("{base}mlp.experts."));
            let (t, sparse) = (model.layer_types[i as usize], model.sparse[i as usize]);
            (layer_tensors(&base, t, sparse, model, split), format!("layer {i} ({} in config.json)", t.name()))
        }
        Scope::MtpLayer(i) => {
            let base = format!("mtp.layers.{i}.");
            let split = split_experts(&format!("{base}mlp.experts."));
            let sparse = model.experts.is_some();
            (layer_tensors(&base, LayerType::FullAttention, sparse, model, split), format!("MTP layer {i}"))
        }
    };
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for t in present {
        *count.entry(t.name.as_str()).or_default() += 1;
    }
    // Two inputs of one name are refused later, naming both sources; neither is held to a shape here.
    for t in present.iter().filter(|t| count[t.name.as_str()] == 1) {
        let Some(e) = expected.get(&t.name) else {
            bail!("{}: {what} has no tensor of this name{}", t.describe(), hint(&t.name, scope, model));
        };
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        if shape != e.shape {
            bail!("{}: shape {:?}, but config.json ({}) makes it {:?}", t.describe(), t.shape, e.from, e.shape);
        }
        match t.source {
            Source::Plain(dtype) if !is_any_float(dtype) => {
                bail!("{}: {dtype:?} values, where the model holds floats", t.describe())
            }
            Source::Coded(_) | Source::Int8(_) if !e.linear => {
                bail!("{}: stored as a quantized linear, but the model holds a float vector here", t.describe())
            }
            _ => {}
        }
    }
    // The MTP head's own tensors are left to the MTP rule (an incomplete head is dropped or kept
    // with a warning); the model's are all required.
    if matches!(scope, Scope::MtpLayer(_)) {
        return Ok(());
    }
    if let Some((name, e)) = expected.iter().find(|(n, e)| e.required && !count.contains_key(n.as_str())) {
        if let (Scope::Layer(i), true) = (scope, present.is_empty()) {
            bail!(
                "no tensor of layer {i} (no {name}): config.json's num_hidden_layers is {}, but the checkpoint \
                 holds no layer {i}",
                model.layer_types.len()
            );
        }
        bail!("no tensor {name}: {what} needs it, of shape {:?} ({})", e.shape, e.from);
    }
    Ok(())
}

/// The expert index of `….experts.{e}.{proj}.weight` under `base` (`….mlp.experts.`).
fn expert_index(name: &str, base: &str) -> Option<u64> {
    name.strip_prefix(base)?.split('.').next()?.parse().ok()
}

/// Why a name has no place, when something can be said.
fn hint(name: &str, scope: Scope, model: &TextModel) -> String {
    let Scope::Layer(i) = scope else { return String::new() };
    let other = match model.layer_types[i as usize] {
        LayerType::LinearAttention if name.contains(".self_attn.") => "full_attention",
        LayerType::FullAttention if name.contains(".linear_attn.") => "linear_attention",
        _ => return String::new(),
    };
    format!(" (a tensor of a {other} layer: config.json's layer_types disagrees with the tensors)")
}
