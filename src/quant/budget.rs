//! The error budget that `--bits auto` (MLX) and `--gguf-type auto` (GGUF) both spend. A coded
//! linear of K trellis bits per weight already carries a relative error of about `2^-K` (near the
//! Shannon bound); re-quantizing it may add at most `R · 2^-K` more (`--max-added-error R`), so the
//! total stays within `√(1 + R²)` of the trellis's own. Of the encodings a format offers, ordered
//! from the narrowest, the first whose added error meets the budget is chosen.

/// The largest added relative error allowed for a coded linear of `k` bits per weight.
pub fn budget(max_added_error: f64, k: u32) -> f64 {
    max_added_error * 0.5f64.powi(k as i32)
}

/// The first of `options` (narrowest first, each with its added relative error) within `budget`;
/// the last, the widest, when none is.
pub fn narrowest_within<T: Copy>(options: &[(T, f64)], budget: f64) -> T {
    options.iter().find(|(_, error)| *error <= budget).unwrap_or(&options[options.len() - 1]).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrowest_option_within_budget_wins() {
        assert_eq!(budget(0.5, 2), 0.125);
        let options = [("q4", 0.2), ("q5", 0.1), ("q6", 0.05)];
        assert_eq!(narrowest_within(&options, 0.125), "q5");
        assert_eq!(narrowest_within(&options, 1.0), "q4");
        assert_eq!(narrowest_within(&options, 0.01), "q6", "the widest when none meets it");
    }
}
