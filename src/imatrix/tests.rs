//! Both files read back to llama-quantize's values; every hostile one refused without a panic.

use super::Imatrix;

/// A GGUF importance matrix: `entries` (name, sums per expert, counts), and the three keys unless
/// `metadata` is false.
fn gguf(entries: &[(&str, Vec<f32>, Vec<f32>)], metadata: bool) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((entries.len() as u64 * 2).to_le_bytes());
    b.extend(if metadata { 3u64 } else { 0 }.to_le_bytes());
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    if metadata {
        string(&mut b, "imatrix.datasets");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        string(&mut b, "wiki.train");
        for (key, v) in [("imatrix.chunk_count", 12u32), ("imatrix.chunk_size", 512)] {
            string(&mut b, key);
            b.extend(4u32.to_le_bytes());
            b.extend(v.to_le_bytes());
        }
    }
    let mut data = Vec::new();
    for (name, sums, counts) in entries {
        let experts = counts.len();
        for (suffix, values, ne) in [(".in_sum2", sums, [sums.len(), 1]), (".counts", counts, [1, experts])] {
            string(&mut b, &format!("{name}{suffix}"));
            b.extend(2u32.to_le_bytes());
            for d in ne {
                b.extend((d as u64).to_le_bytes());
            }
            b.extend(0u32.to_le_bytes());
            b.extend((data.len() as u64).to_le_bytes());
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            data.resize(data.len().div_ceil(32) * 32, 0);
        }
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend(data);
    b
}

fn dat(entries: &[(&str, i32, Vec<f32>)], trailer: bool) -> Vec<u8> {
    let mut b = (entries.len() as i32).to_le_bytes().to_vec();
    for (name, ncall, values) in entries {
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(ncall.to_le_bytes());
        b.extend((values.len() as i32).to_le_bytes());
        b.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    if trailer {
        b.extend(40i32.to_le_bytes());
        b.extend(4i32.to_le_bytes());
        b.extend(b"wiki");
    }
    b
}

fn error(bytes: &[u8]) -> String {
    format!("{:#}", Imatrix::from_bytes(bytes).expect_err("refused"))
}

#[test]
fn gguf_values_are_sums_over_rounded_counts_per_expert() {
    let m = Imatrix::from_bytes(&gguf(
        &[
            ("blk.0.ffn_down_exps.weight", vec![2.0, 4.0, 6.0, 8.0, 1.0, 1.0], vec![2.4, 0.0, 4.0]),
            ("output.weight", vec![3.0, 0.0], vec![3.0]),
        ],
        true,
    ))
    .unwrap();
    assert_eq!(&*m.entries["blk.0.ffn_down_exps.weight"].values, &[1.0, 2.0, 1.0, 1.0, 0.25, 0.25]);
    assert_eq!(&*m.entries["output.weight"].values, &[1.0, 0.0]);
    assert_eq!(
        (m.datasets.as_slice(), m.chunk_count, m.chunk_size, m.format),
        (&["wiki.train".to_string()][..], 12, Some(512), "gguf")
    );
    assert_eq!(m.sha256.len(), 64);
}

#[test]
fn dat_values_are_sums_over_calls() {
    let m =
        Imatrix::from_bytes(&dat(&[("blk.0.attn_q.weight", 4, vec![8.0, 2.0]), ("output.weight", 0, vec![3.0])], true))
            .unwrap();
    assert_eq!(&*m.entries["blk.0.attn_q.weight"].values, &[2.0, 0.5]);
    assert_eq!(&*m.entries["output.weight"].values, &[3.0]);
    assert_eq!(
        (m.datasets.as_slice(), m.chunk_count, m.chunk_size, m.format),
        (&["wiki".to_string()][..], 40, None, "dat")
    );
    let bare = Imatrix::from_bytes(&dat(&[("a", 1, vec![1.0])], false)).unwrap();
    assert_eq!((bare.chunk_count, bare.datasets.len()), (0, 0));
}

#[test]
fn bad_values_are_refused_naming_the_entry() {
    for bad in [f32::NAN, f32::INFINITY, -1.0] {
        let e = error(&gguf(&[("blk.3.attn_k.weight", vec![1.0, bad], vec![1.0])], true));
        assert!(e.contains("blk.3.attn_k.weight") && e.contains("value 1"), "{e}");
        let e = error(&dat(&[("blk.3.attn_k.weight", 1, vec![bad])], false));
        assert!(e.contains("blk.3.attn_k.weight"), "{e}");
    }
    let e = error(&gguf(&[("x", vec![1.0], vec![f32::NAN])], true));
    assert!(e.contains("count 0"), "{e}");
    assert!(error(&gguf(&[("x", vec![1.0, 2.0, 3.0], vec![1.0, 1.0])], true)).contains("do not divide"));
    assert!(error(&gguf(&[("x", vec![1.0], vec![1.0])], false)).contains("missing imatrix metadata"));
}

#[test]
fn every_truncation_and_corruption_is_refused_without_a_panic() {
    let good = gguf(&[("blk.0.attn_q.weight", vec![1.0; 64], vec![3.0])], true);
    for len in 0..good.len() - 1 {
        // Cut into the data of the last tensor or before: never a panic, nearly always an error.
        let _ = Imatrix::from_bytes(&good[..len]);
    }
    assert!(Imatrix::from_bytes(&good[..good.len() - 40]).is_err());
    // Counts and lengths beyond the file.
    for at in [8, 16] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(error(&b).contains("do not fit"));
    }
    let good = dat(&[("blk.0.attn_q.weight", 2, vec![1.0; 8])], true);
    for len in 0..good.len() {
        let _ = Imatrix::from_bytes(&good[..len]);
    }
    let mut b = good.clone();
    b[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
    assert!(Imatrix::from_bytes(&b).is_err());
    assert!(Imatrix::from_bytes(&[]).is_err());
    assert!(Imatrix::from_bytes(&0x7fff_ffffi32.to_le_bytes()).is_err());
}
