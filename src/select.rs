//! `--only GLOB` selection: `*` matches any run of characters (dots included), `?` one character.

/// Whether `name` matches any of `globs` (an empty list matches everything).
pub fn selected(name: &str, globs: &[String]) -> bool {
    if globs.is_empty() {
        return true;
    }
    // Characters, not bytes: `?` stands for one character of a name however it is encoded.
    let text: Vec<char> = name.chars().collect();
    globs.iter().any(|g| glob_match(&g.chars().collect::<Vec<_>>(), &text))
}

/// Wildcard match with one backtrack point (the last `*`): at most pattern × name steps.
fn glob_match(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((bp, bt)) => {
                    p = bp + 1;
                    t = bt + 1;
                    backtrack = Some((bp, bt + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let g = |s: &str| vec![s.to_string()];
        assert!(selected("model.layers.0.mlp.up_proj.weight", &g("model.layers.0.*")));
        assert!(!selected("model.layers.10.mlp.up_proj.weight", &g("model.layers.1.*")));
        assert!(selected("model.layers.10.mlp.up_proj.weight", &g("*.mlp.*")));
        assert!(selected("lm_head.weight", &g("lm_head.weigh?")));
        assert!(!selected("lm_head.weight", &g("lm_head")));
        assert!(selected("anything", &[]));
        assert!(selected("model.blöck.weight", &g("model.bl?ck.*")));
    }
}
