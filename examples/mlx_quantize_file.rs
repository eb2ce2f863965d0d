//! Test helper: quantizes every 2-D float tensor of a safetensors file with this crate's MLX
//! affine quantizer, so that a test can compare the bytes with `mx.quantize`.
//!
//! ```text
//! mlx_quantize_file IN.safetensors OUT.safetensors --bits B --group-size G
//! mlx_quantize_file IN.safetensors OUT.safetensors --int8 [--scale-dtype f32|f16|bf16]
//! ```
//!
//! Float mode: tensor `X` (F32, F16 or BF16 `[rows, cols]`) becomes `X.weight` (U32),
//! `X.scales` and `X.biases` (in `X`'s dtype). Int8 mode: pairs `X.weight_int8` (I8) +
//! `X.weight_scale` (float, one per row) become the exact 8-bit repack, scales in
//! `--scale-dtype` (default f32), at the largest group size dividing the row.

use anyhow::{bail, Context, Result};
use escha_convert::checkpoint::tensor::floats_to_f32;
use escha_convert::quant::affine::{int8_group_size, quantize_rows, repack_int8_rows, AffineOut, AffineSpec};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut positional = Vec::new();
    let (mut bits, mut group_size, mut int8, mut scale_dtype) = (4u32, 64usize, false, Dtype::F32);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bits" => bits = it.next().context("--bits needs a value")?.parse()?,
            "--group-size" => group_size = it.next().context("--group-size needs a value")?.parse()?,
            "--int8" => int8 = true,
            "--scale-dtype" => {
                scale_dtype = match it.next().context("--scale-dtype needs a value")?.as_str() {
                    "f32" => Dtype::F32,
                    "f16" => Dtype::F16,
                    "bf16" => Dtype::BF16,
                    other => bail!("unknown scale dtype {other}"),
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [input, output] = positional.as_slice() else {
        bail!("usage: mlx_quantize_file IN.safetensors OUT.safetensors [--bits B --group-size G | --int8]");
    };
    let bytes = std::fs::read(input).with_context(|| format!("{input}: cannot read"))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let mut out: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let mut values = Vec::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        if int8 {
            let Some(path) = name.strip_suffix(".weight_int8") else { continue };
            let (rows, cols) = (shape[0], shape[1]);
            let scale = st.tensor(&format!("{path}.weight_scale"))?;
            values.clear();
            floats_to_f32(scale.data(), scale.dtype(), &mut values)?;
            let gs = int8_group_size(cols).with_context(|| format!("{name}: no group size divides {cols}"))?;
            let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
            let sink = &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b };
            repack_int8_rows(view.data(), &values, cols, gs, scale_dtype, sink);
            out.insert(format!("{path}.weight"), (Dtype::U32, vec![rows, cols / 4], p));
            out.insert(format!("{path}.scales"), (scale_dtype, vec![rows, cols / gs], s.clone()));
            out.insert(format!("{path}.biases"), (scale_dtype, vec![rows, cols / gs], b));
            continue;
        }
        if shape.len() != 2 {
            bail!("{name}: expected a 2-D tensor, found {shape:?}");
        }
        let spec = AffineSpec::new(bits, group_size).map_err(anyhow::Error::msg)?;
        let (rows, cols) = (shape[0], shape[1]);
        values.clear();
        floats_to_f32(view.data(), view.dtype(), &mut values)?;
        let (mut p, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        quantize_rows(
            &values,
            cols,
            spec,
            view.dtype(),
            &mut AffineOut { packed: &mut p, scales: &mut s, biases: &mut b },
        );
        out.insert(format!("{name}.weight"), (Dtype::U32, vec![rows, spec.packed_cols(cols)], p));
        out.insert(format!("{name}.scales"), (view.dtype(), vec![rows, spec.groups(cols)], s));
        out.insert(format!("{name}.biases"), (view.dtype(), vec![rows, spec.groups(cols)], b));
    }
    let views: Vec<(String, TensorView)> =
        out.iter().map(|(k, (d, s, b))| Ok((k.clone(), TensorView::new(*d, s.clone(), b)?))).collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, None, std::path::Path::new(output))?;
    Ok(())
}
