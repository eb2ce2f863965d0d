//! The page's only style and script, embedded at compile time, and the Content-Security-Policy
//! that allows exactly those bytes by their SHA-256 and nothing else.

/// The styles; the file starts with a newline, which is part of the hashed bytes.
pub const STYLE: &str = include_str!("page.css");
/// The table sorter; starts with a newline too.
pub const SCRIPT: &str = include_str!("page.js");

/// The policy for a page whose `<style>` holds `STYLE` and whose `<script>` holds `SCRIPT`:
/// no network, no other script or style, no forms.
pub fn policy() -> String {
    format!(
        "default-src 'none'; style-src 'sha256-{}'; script-src 'sha256-{}'; img-src 'none'; base-uri 'none'; \
         form-action 'none'",
        base64(&sha256(STYLE.as_bytes())),
        base64(&sha256(SCRIPT.as_bytes()))
    )
}

fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// Standard base64 with padding, as CSP hash sources are written.
fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn the_policy_hashes_the_page_s_style_and_script() {
        let page = super::super::render_html(&super::super::tests::crafted());
        for (open, close) in [("<style>", "</style>"), ("<script>", "</script>")] {
            let at = page.find(open).unwrap() + open.len();
            let body = &page[at..at + page[at..].find(close).unwrap()];
            let hash = format!("'sha256-{}'", base64(&sha256(body.as_bytes())));
            assert!(page.contains(&hash), "{open} hash {hash} missing from the policy");
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(!page.contains(" style=\""), "style attributes would need 'unsafe-inline'");
    }
}
