//! One output tensor: its name, dtype and shape, and how it is made: rows from a source, the
//! adjustments applied to them, and the encoding that turns them into stored bytes.

use crate::checkpoint::tensor::view;
use crate::checkpoint::Catalog;
use crate::quant::affine::AffineSpec;
use crate::storage::Storage;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::ops::Range;

/// Where the rows of an output tensor come from. A source is a stack of `leads` matrices of
/// `rows.len()` rows each (a single matrix has one lead); output row `g` is row
/// `rows.start + g % rows.len()` of lead `g / rows.len()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowSource {
    /// Rows of coded module `catalog.coded[module]`, reconstructed in f32; one lead per expert.
    Coded { module: usize, rows: Range<usize> },
    /// Every row of int8 pair `catalog.int8[i]`, dequantized exactly in f32.
    Int8(usize),
    /// Rows of an input tensor viewed as `[leads, rows, width]` (see
    /// [`crate::checkpoint::tensor::view`]), each cut to its first `cols` columns.
    Tensor { name: String, rows: Range<usize>, cols: usize },
    /// Single-matrix sources stacked as leads (per-expert modules written as one `[E, …]` tensor).
    Stack(Vec<RowSource>),
    /// The rows (global, lead-major) and the columns of `inner` in another order.
    Reordered { inner: Box<RowSource>, rows: Option<HeadOrder>, cols: Option<HeadOrder> },
    /// A box of an input tensor viewed as `[leads, rows, width]`: leads `leads`, rows `rows` of
    /// each, columns `cols` of each row (one expert's slice of a stacked tensor, one half of a
    /// fused one); output rows are lead-major.
    Slice { name: String, leads: Range<usize>, rows: Range<usize>, cols: Range<usize> },
    /// The element-wise product of two sources of one shape (a sign×scale vector and the scale
    /// folded into it), computed exactly and rounded to odd in f32: a later rounding to a 16-bit
    /// float is then the one rounding of the exact product.
    Product(Box<RowSource>, Box<RowSource>),
    /// One row of `width` values given as their stored bytes (a marker tensor).
    Literal { bytes: Vec<u8>, width: usize },
}

/// A permutation of indices that moves heads: the `per_key` heads of `head` entries that follow
/// each of `key_heads` key heads (grouped: k0v0 k0v1 … k1v0 …) are laid out tiled instead (k0v0
/// k1v0 … k0v1 k1v1 …), as llama.cpp wants linear-attention V heads. The first `skip` indices
/// (the Q and K parts of a fused projection) stay in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadOrder {
    pub skip: usize,
    pub key_heads: usize,
    pub per_key: usize,
    pub head: usize,
}

impl HeadOrder {
    /// How many indices it orders (the width of the axis it reorders).
    pub fn width(&self) -> usize {
        self.skip + self.key_heads * self.per_key * self.head
    }

    /// The input index that output index `i` takes.
    pub fn source(&self, i: usize) -> usize {
        let Some(p) = i.checked_sub(self.skip) else { return i };
        let (h, d) = (p / self.head, p % self.head);
        let (v, k) = (h / self.key_heads, h % self.key_heads);
        self.skip + (k * self.per_key + v) * self.head + d
    }

    /// The order as runs that stay together: `(output start, input start, length)`, by output.
    pub fn runs(&self) -> Vec<(usize, usize, usize)> {
        let heads = self.key_heads * self.per_key;
        let mut runs = Vec::with_capacity(heads + 1);
        if self.skip > 0 {
            runs.push((0, 0, self.skip));
        }
        for h in 0..heads {
            let out = self.skip + h * self.head;
            runs.push((out, self.source(out), self.head));
        }
        runs
    }

    /// Reorders every row of `values` (rows of `width == len()` values) in place through `scratch`.
    pub fn apply_to_rows<T: Copy>(&self, values: &mut [T], scratch: &mut Vec<T>) {
        let runs = self.runs();
        for row in values.chunks_exact_mut(self.width()) {
            scratch.clear();
            scratch.extend_from_slice(row);
            for &(out, from, len) in &runs {
                row[out..out + len].copy_from_slice(&scratch[from..from + len]);
            }
        }
    }
}

impl RowSource {
    /// What the rows come from, for messages.
    pub fn describe(&self, cat: &Catalog) -> String {
        match self {
            RowSource::Coded { module, .. } => format!("coded module {}", cat.coded[*module].path),
            RowSource::Int8(i) => format!("int8 pair {}", cat.int8[*i].weight),
            RowSource::Tensor { name, .. } => format!("tensor {name}"),
            RowSource::Stack(members) => {
                format!("{} stacked members (first {})", members.len(), members[0].describe(cat))
            }
            RowSource::Reordered { inner, .. } => inner.describe(cat),
            RowSource::Slice { name, leads, rows, cols } => {
                format!("tensor {name} (leads {leads:?}, rows {rows:?}, columns {cols:?})")
            }
            RowSource::Product(a, b) => format!("{} times {}", a.describe(cat), b.describe(cat)),
            RowSource::Literal { .. } => "a constant".into(),
        }
    }

    /// The coded modules the rows are reconstructed from.
    pub fn coded_modules(&self) -> Vec<usize> {
        match self {
            RowSource::Coded { module, .. } => vec![*module],
            RowSource::Stack(members) => members.iter().flat_map(RowSource::coded_modules).collect(),
            RowSource::Reordered { inner, .. } => inner.coded_modules(),
            RowSource::Int8(_)
            | RowSource::Tensor { .. }
            | RowSource::Slice { .. }
            | RowSource::Product(..)
            | RowSource::Literal { .. } => Vec::new(),
        }
    }

    /// The input tensors the rows are read from by name (a coded module's or an int8 pair's are
    /// not named here).
    pub fn tensor_names(&self) -> Vec<&str> {
        match self {
            RowSource::Tensor { name, .. } | RowSource::Slice { name, .. } => vec![name.as_str()],
            RowSource::Stack(members) => members.iter().flat_map(RowSource::tensor_names).collect(),
            RowSource::Reordered { inner, .. } => inner.tensor_names(),
            RowSource::Product(a, b) => a.tensor_names().into_iter().chain(b.tensor_names()).collect(),
            RowSource::Coded { .. } | RowSource::Int8(_) | RowSource::Literal { .. } => Vec::new(),
        }
    }

    /// Every row and column of an input tensor of shape `shape`.
    pub fn whole(name: &str, shape: &[usize]) -> RowSource {
        let (_, rows, cols) = view(shape);
        RowSource::Tensor { name: name.to_string(), rows: 0..rows, cols }
    }
}

/// What is done to the f32 rows before they are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adjust {
    /// Add 1 to every value: a zero-centred norm written with its offset folded in.
    pub plus_one: bool,
    /// Replace every value `x` by `−exp(x)`: a linear-attention `A_log` written as the decay
    /// `A` itself (llama.cpp's `ssm_a`). Computed in f64 and rounded once.
    pub neg_exp: bool,
    /// Zero the input columns of the channels that are dead in this fused `gate_up` coded module
    /// (both its gate and its up scale exactly zero), per lead: a down projection whose dead
    /// columns only ever meet zero activations.
    pub dead_columns_of: Option<usize>,
}

/// The output tensors that hold an affine tensor's per-group scales and biases, by name (the plan
/// resolves them to indices once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AffineParams {
    pub scales: String,
    pub biases: String,
}

/// How rows become stored bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// f32 rows rounded once (to nearest, ties to even) to the tensor's dtype: BF16, F16 or F32.
    Float,
    /// The stored bytes of the source, unchanged (tensors that are not floats).
    Bytes,
    /// Affine quantization of the rows, first rounded to the dtype of the scales (the values a
    /// model in that dtype holds), packed into U32 words; the units also write the scales and
    /// biases.
    Affine { spec: AffineSpec, params: AffineParams },
    /// int8 rows with one scale per row, repacked exactly as 8-bit affine at `group_size`.
    Int8Affine { group_size: usize, params: AffineParams },
    /// int8 rows with one f16 scale per row, as `Q8_0` blocks that each carry the row's scale:
    /// exactly the stored values.
    Int8Blocks,
}

/// The importance of each input column of a tensor's rows (an importance matrix's entry), per
/// lead: `lead · columns + column`. A block encoding weighs each value's error by it as ggml does.
#[derive(Clone, Debug)]
pub struct Importance(pub std::sync::Arc<[f32]>);

impl Importance {
    /// The importance of the columns `cols` of global (lead-major) row `row` of a source of
    /// `rows_per_lead` rows of `width` columns.
    pub fn of_row(&self, row: usize, rows_per_lead: usize, width: usize, cols: Range<usize>) -> &[f32] {
        let lead = row / rows_per_lead.max(1);
        &self.0[lead * width + cols.start..lead * width + cols.end]
    }
}

/// Where a tensor's importance comes from (`--imatrix`): the llama.cpp name of the matrix's entry
/// for it, and, where llama.cpp orders its input columns otherwise, that order (`GGUF column i is
/// column cols.source(i)` of the tensor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImatrixKey {
    pub name: String,
    pub cols: Option<HeadOrder>,
}

impl PartialEq for Importance {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(other.0.iter()).all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for Importance {}

/// How an output tensor is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    pub source: RowSource,
    pub adjust: Adjust,
    pub encoding: Encoding,
    /// The importance of its columns, for a block encoding (`--imatrix`).
    pub importance: Option<Importance>,
}

/// What kind of tensor an output is, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Coded,
    CodedExperts,
    Int8,
    Norm,
    Bias,
    Plain,
    /// Scales or biases of an affine-quantized tensor.
    QuantParams,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Coded => "coded",
            Kind::CodedExperts => "coded_experts",
            Kind::Int8 => "int8",
            Kind::Norm => "norm",
            Kind::Bias => "bias",
            Kind::Plain => "plain",
            Kind::QuantParams => "quant_params",
        }
    }
}

/// One tensor of the output checkpoint.
#[derive(Clone, Debug)]
pub struct OutputTensor {
    pub name: String,
    pub storage: Storage,
    pub shape: Vec<usize>,
    pub kind: Kind,
    /// How it is made; `None` for the scales and biases of an affine tensor, which that tensor's
    /// work units write.
    pub recipe: Option<Recipe>,
}

impl OutputTensor {
    /// A tensor made from `source` by `encoding`, rows unadjusted.
    pub fn new(
        name: String,
        storage: impl Into<Storage>,
        shape: Vec<usize>,
        kind: Kind,
        source: RowSource,
        encoding: Encoding,
    ) -> Self {
        let recipe = Some(Recipe { source, adjust: Adjust::default(), encoding, importance: None });
        OutputTensor { name, storage: storage.into(), shape, kind, recipe }
    }

    /// The scales or biases of an affine tensor.
    pub fn companion(name: String, storage: impl Into<Storage>, shape: Vec<usize>) -> Self {
        OutputTensor { name, storage: storage.into(), shape, kind: Kind::QuantParams, recipe: None }
    }

    /// Applies `adjust` to its rows.
    pub fn adjust(&mut self, adjust: Adjust) {
        if let Some(r) = &mut self.recipe {
            r.adjust = adjust;
        }
    }

    /// The tensor as a container sees it.
    pub fn info(&self) -> crate::container::TensorInfo<'_> {
        crate::container::TensorInfo { name: &self.name, storage: self.storage, shape: &self.shape }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> usize {
        self.storage.byte_len(self.numel())
    }

    /// Weights the tensor holds, counting packed affine words as the values they pack and
    /// scales and biases as none.
    pub fn weights(&self) -> u64 {
        let n = self.numel() as u64;
        if self.kind == Kind::QuantParams {
            return 0;
        }
        match self.recipe.as_ref().map(|r| &r.encoding) {
            None => 0,
            // Trellis words copied as stored (`[IC/16, OC/16, 16K]`): 256 weights per tile.
            Some(Encoding::Bytes) if matches!(self.kind, Kind::Coded | Kind::CodedExperts) => {
                self.shape.iter().rev().skip(1).product::<usize>() as u64 * 256
            }
            Some(Encoding::Affine { spec, .. }) => n * 32 / spec.bits as u64,
            Some(Encoding::Int8Affine { .. }) => n * 4,
            Some(Encoding::Float | Encoding::Bytes | Encoding::Int8Blocks) => n,
        }
    }

    /// The input columns of each row: the last dimension, unpacked where affine words pack it.
    pub fn columns(&self) -> usize {
        let last = self.shape.last().copied().unwrap_or(1);
        match self.recipe.as_ref().map(|r| &r.encoding) {
            Some(Encoding::Affine { spec, .. }) => last * 32 / spec.bits as usize,
            Some(Encoding::Int8Affine { .. }) => last * 4,
            _ => last,
        }
    }
}

/// Refuses two output tensors with one name (two inputs that map to the same output), naming
/// both sources: writing one would silently drop the other.
pub fn check_unique_names(tensors: &[OutputTensor], cat: &Catalog) -> Result<()> {
    let mut seen: HashMap<&str, &OutputTensor> = HashMap::with_capacity(tensors.len());
    for t in tensors {
        if let Some(first) = seen.insert(&t.name, t) {
            let from = |t: &OutputTensor| {
                t.recipe
                    .as_ref()
                    .map_or_else(|| "the scales or biases of a quantized tensor".into(), |r| r.source.describe(cat))
            };
            bail!(
                "output tensor {} would be written from both {} and {}; refusing to drop either",
                t.name,
                from(first),
                from(t)
            );
        }
    }
    Ok(())
}
