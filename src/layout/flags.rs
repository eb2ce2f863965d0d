//! The flags that shaped an output, written again as a command line's words: the output's marker
//! fingerprints them and its model card records them. Each format spells its own
//! ([`Layout::shaping_flags`](super::Layout::shaping_flags)); the engine adds the rest.

/// The words of a command line, flag by flag: how an output's marker and model card say again
/// which flags shaped it.
#[derive(Debug, Default)]
pub struct FlagWords(Vec<String>);

impl FlagWords {
    /// A flag that takes no value.
    pub fn switch(&mut self, flag: &str) {
        self.0.push(flag.into());
    }

    /// `flag value`, for a value no shell treats specially.
    pub fn value(&mut self, flag: &str, value: &str) {
        self.quoted(flag, value, value);
    }

    /// `flag value`, the value written as `quoted` for a shell; `flag=value` when the value starts
    /// with `-`, which the command line would otherwise take for a flag.
    pub fn quoted(&mut self, flag: &str, value: &str, quoted: &str) {
        if value.starts_with('-') {
            self.0.push(format!("{flag}={quoted}"));
        } else {
            self.0.push(flag.into());
            self.0.push(quoted.into());
        }
    }

    /// The words, one space between each.
    pub fn line(&self) -> String {
        self.0.join(" ")
    }
}
