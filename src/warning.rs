//! Warnings: what a run did that its user may not expect, said once on stderr
//! (`escha-convert: warning: …`) and listed in the `--json` document with a stable code beside
//! the text, so a CI job can act on the code instead of matching words. The codes are listed in
//! `docs/escha-convert.schema.json`; a code is never renamed or given another meaning.

use serde::Serialize;
use std::fmt;

/// What a warning is about; serialized in snake case (`mtp_dropped`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// An Escha coded linear names a codebook no Escha release uses (decoded all the same).
    UnusualCodebook,
    /// The vision-tower tensors were left out.
    VisionDropped,
    /// `-j` asked for more than four threads per core; fewer were used.
    ThreadsCapped,
    /// A staging directory an earlier run left behind was removed.
    StaleStagingRemoved,
    /// A directory named like a staging directory holds something else and was kept.
    StaleStagingKept,
    /// Bias tensors of coded linears were written that stock loaders have no slot for, or that the
    /// source's runtime never applies.
    BiasKept,
    /// Non-zero bias tensors of coded linears were left out (an Escha input's by default, any with
    /// `--bias drop`, or for want of a slot in the format).
    BiasDropped,
    /// `--mtp auto` left out an MTP head that is incomplete.
    MtpDropped,
    /// `--mtp keep` wrote an MTP head that is incomplete.
    MtpIncompleteKept,
    /// The MLX layout left out the MTP head (it carries none).
    MlxMtpDropped,
    /// The MLX layout left out `lm_head`: the embeddings are tied.
    TiedHeadDropped,
    /// The MLX layout left out the bias tensors of stacked experts (no slot for them).
    ExpertBiasesDropped,
    /// A special token id beyond the vocabulary was left out of the GGUF (llama.cpp would use
    /// another token).
    SpecialTokenSkipped,
    /// `--part I/N` owns no shard: it writes only the files beside the shards.
    EmptyPart,
    /// IN is a single `.safetensors` file: tensors only, unchecked, and no config.json written.
    TensorsOnly,
}

impl WarningCode {
    /// Every code, in the order the schema lists them.
    pub const ALL: [WarningCode; 15] = [
        WarningCode::UnusualCodebook,
        WarningCode::VisionDropped,
        WarningCode::ThreadsCapped,
        WarningCode::StaleStagingRemoved,
        WarningCode::StaleStagingKept,
        WarningCode::BiasKept,
        WarningCode::BiasDropped,
        WarningCode::MtpDropped,
        WarningCode::MtpIncompleteKept,
        WarningCode::MlxMtpDropped,
        WarningCode::TiedHeadDropped,
        WarningCode::ExpertBiasesDropped,
        WarningCode::SpecialTokenSkipped,
        WarningCode::EmptyPart,
        WarningCode::TensorsOnly,
    ];
}

/// One warning: its code and the text printed on stderr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub code: WarningCode,
    pub message: String,
}

impl Warning {
    pub fn new(code: WarningCode, message: impl Into<String>) -> Warning {
        Warning { code, message: message.into() }
    }
}

impl fmt::Display for Warning {
    /// The text alone, as stderr shows it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_serializes_as_its_code_and_text() {
        let w = Warning::new(WarningCode::MtpDropped, "dropped the MTP head");
        let v = serde_json::to_value(&w).unwrap();
        assert_eq!(v, serde_json::json!({"code": "mtp_dropped", "message": "dropped the MTP head"}));
        assert_eq!(w.to_string(), "dropped the MTP head");
    }
}
