//! `--only GLOB` selection: `*` matches any run of characters (dots included), `?` one character.

/// Whether `name` matches any of `globs` (an empty list matches everything).
pub fn selected(name: &str, globs: &[String]) -> bool {
    globs.is_empty() || globs.iter().any(|g| glob_match(g.as_bytes(), name.as_bytes()))
}

fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
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
    pattern[p..].iter().all(|&c| c == b'*')
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
    }
}
