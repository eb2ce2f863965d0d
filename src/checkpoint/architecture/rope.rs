//! The rotary settings (`rope_parameters`, `rope_scaling`): the rope types both transformers
//! (`ROPE_INIT_FUNCTIONS`) and mlx-lm (`initialize_rope`) run for this family, each parameter
//! typed and bounded to what both compute with; any other type refused, naming the client that
//! does not run it.

use super::keys::{excerpt, positive, MAX_DIM, MAX_POSITIONS};
use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// What the rotation of one rope dictionary is computed from beyond the dictionary itself.
pub(super) struct RopeContext<'a> {
    /// Where the dictionary stands in config.json (`text_config.rope_parameters`).
    pub(super) at: &'a str,
    /// The dictionary mlx-lm reads the rotation from for this model type, and the type's name.
    pub(super) mlx_reads: bool,
    pub(super) mlx_key: &'a str,
    pub(super) model_type: &'a str,
    /// The head's width, and the base when the dictionary gives none (the config's `rope_theta`).
    pub(super) head_dim: u64,
    pub(super) theta: Option<f64>,
    pub(super) partial: Option<f64>,
}

/// The rope type of a dictionary: `rope_type`, or the older `type`; "default" when neither.
pub(super) fn rope_type<'a>(r: &'a Map<String, Value>, at: &str) -> Result<&'a str> {
    let read = |key: &str| match r.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(t)) => Ok(Some(t.as_str())),
        Some(v) => bail!("config.json: {at}.{key} is {}, not a string", excerpt(v)),
    };
    match (read("rope_type")?, read("type")?) {
        (Some(a), Some(b)) if a != b => {
            bail!("config.json: {at}.rope_type is {a:?} but {at}.type is {b:?}: the clients read one or the other")
        }
        (Some(t), _) | (None, Some(t)) => Ok(t),
        (None, None) => Ok("default"),
    }
}

/// Checks one rope dictionary: its base, partial factor and multimodal section, then the
/// parameters of its type.
pub(super) fn rope_parameters(r: &Map<String, Value>, cx: &RopeContext) -> Result<()> {
    let at = cx.at;
    if let Some(theta) = r.get("rope_theta") {
        positive(theta, &format!("{at}.rope_theta"))?;
    }
    if let Some(f) = r.get("partial_rotary_factor") {
        if !f.as_f64().is_some_and(|f| f > 0.0 && f <= 1.0) {
            bail!("config.json: {at}.partial_rotary_factor is {}, not a number in (0, 1]", excerpt(f));
        }
    }
    // transformers' Qwen3.5 rotary embedding reads the sections of the height and width axes
    // (`mrope_section[1]`, `[2]`) whatever the list holds.
    if let Some(m) = r.get("mrope_section") {
        let ok =
            |a: &Vec<Value>| (3..=8).contains(&a.len()) && a.iter().all(|x| x.as_u64().is_some_and(|n| n <= MAX_DIM));
        if !m.as_array().is_some_and(ok) {
            bail!("config.json: {at}.mrope_section is {}, not a list of 3 to 8 whole numbers", excerpt(m));
        }
    }
    let kind = rope_type(r, at)?;
    match kind {
        "default" => return Ok(()),
        "linear" | "dynamic" | "yarn" | "llama3" | "longrope" => {}
        "proportional" => bail!(
            "config.json: {at}.rope_type is \"proportional\": mlx-lm applies partial_rotary_factor to it a second \
             time for this family (a fraction of the rotated fraction), so it and transformers would rotate differently"
        ),
        "mrope" | "deepseek_yarn" | "telechat3-yarn" => bail!(
            "config.json: {at}.rope_type is {kind:?}, which transformers does not run (its ROPE_INIT_FUNCTIONS \
             has no such type); this family's clients run default, linear, dynamic, yarn, llama3 and longrope"
        ),
        other => bail!(
            "config.json: {at}.rope_type is {other:?}, which neither transformers nor mlx-lm runs; this family's \
             clients run default, linear, dynamic, yarn, llama3 and longrope"
        ),
    }
    if !cx.mlx_reads {
        bail!(
            "config.json: {at} asks for {kind:?} rotary scaling, but mlx-lm reads model_type {:?}'s rotation from {} \
             and would run this model unscaled; put the scaling there",
            cx.model_type,
            cx.mlx_key
        );
    }
    let p = Params { r, at };
    match kind {
        "linear" | "dynamic" => {
            p.factor(true)?;
        }
        "yarn" => yarn(&p, cx)?,
        "llama3" => {
            p.factor(true)?;
            p.original_positions()?;
            let low = p.number("low_freq_factor", true)?.unwrap_or(1.0);
            let high = p.number("high_freq_factor", true)?.unwrap_or(4.0);
            if high <= low {
                // Both clients divide by their difference.
                bail!("config.json: {at}.high_freq_factor ({high}) is not above {at}.low_freq_factor ({low})");
            }
        }
        _ => longrope(&p, cx)?,
    }
    Ok(())
}

/// `YaRN`: the parameters both clients compute the same rotation and attention factor from.
fn yarn(p: &Params, cx: &RopeContext) -> Result<()> {
    let at = p.at;
    p.factor(true)?;
    p.original_positions()?;
    p.number("beta_fast", false)?;
    p.number("beta_slow", false)?;
    // transformers divides by the base's logarithm when it finds the correction range.
    let theta = p.r.get("rope_theta").and_then(Value::as_f64).or(cx.theta).unwrap_or(10000.0);
    if theta <= 1.0 {
        bail!("config.json: the rotary base of {at} is {theta}; YaRN divides by its logarithm, so it must be above 1");
    }
    match (p.number("mscale", false)?, p.number("mscale_all_dim", false)?) {
        (Some(_), Some(_)) | (None, None) => {}
        _ => bail!(
            "config.json: {at} gives one of mscale and mscale_all_dim without the other; transformers then ignores \
             it while mlx-lm scales attention by it (give both, or neither)"
        ),
    }
    if let Some(v) = p.r.get("attention_factor").filter(|v| !v.is_null()) {
        bail!(
            "config.json: {at}.attention_factor is {}; mlx-lm does not read it (its YarnRoPE derives the factor from \
             factor, mscale and mscale_all_dim), so it and transformers would scale attention differently",
            excerpt(v)
        );
    }
    match p.r.get("truncate") {
        None | Some(Value::Null | Value::Bool(true)) => {}
        Some(v) => {
            bail!("config.json: {at}.truncate is {}; mlx-lm always truncates the correction range (true)", excerpt(v))
        }
    }
    Ok(())
}

/// `LongRoPE`: a per-frequency factor list of half the rotated width, for short and long contexts.
fn longrope(p: &Params, cx: &RopeContext) -> Result<()> {
    let at = p.at;
    p.factor(false)?;
    p.original_positions()?;
    if let Some(v) = p.r.get("attention_factor").filter(|v| !v.is_null()) {
        bail!("config.json: {at}.attention_factor is {}; mlx-lm's LongRoPE does not read it", excerpt(v));
    }
    // This family's clients rotate a quarter of the head unless told otherwise.
    let partial = p.r.get("partial_rotary_factor").and_then(Value::as_f64).or(cx.partial).unwrap_or(0.25);
    let half = ((cx.head_dim as f64 * partial) as u64) / 2;
    for key in ["short_factor", "long_factor"] {
        let ok = p.r.get(key).and_then(Value::as_array).is_some_and(|a| {
            a.len() as u64 == half && a.iter().all(|x| x.as_f64().is_some_and(|f| f.is_finite() && f > 0.0))
        });
        if !ok {
            bail!(
                "config.json: {at}.{key} must be a list of {half} finite numbers > 0 (one per rotated frequency), \
                 not {}",
                p.r.get(key).map_or("absent".to_string(), excerpt)
            );
        }
    }
    Ok(())
}

/// The parameters of one rope dictionary, read with its place for messages.
struct Params<'a> {
    r: &'a Map<String, Value>,
    at: &'a str,
}

impl Params<'_> {
    /// A finite number > 0 (and at most the position bound: no client extends a context further).
    fn number(&self, key: &str, required: bool) -> Result<Option<f64>> {
        let at = self.at;
        match self.r.get(key).filter(|v| !v.is_null()) {
            None if required => bail!("config.json: {at} has no {key}, which its rope_type computes with"),
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 && x <= MAX_POSITIONS as f64 => Ok(Some(x)),
                _ => bail!(
                    "config.json: {at}.{key} is {}, not a finite number > 0 (at most {MAX_POSITIONS})",
                    excerpt(v)
                ),
            },
        }
    }

    fn factor(&self, required: bool) -> Result<Option<f64>> {
        self.number("factor", required)
    }

    /// The context the model was trained on: a whole number of positions.
    fn original_positions(&self) -> Result<u64> {
        let (at, key) = (self.at, "original_max_position_embeddings");
        match self.r.get(key).filter(|v| !v.is_null()) {
            None => bail!("config.json: {at} has no {key}, which its rope_type computes with"),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_POSITIONS).contains(&n) => Ok(n),
                _ => bail!("config.json: {at}.{key} is {}, not a whole number from 1 to {MAX_POSITIONS}", excerpt(v)),
            },
        }
    }
}
