//! The columns of the findings tables, one list per kind of row. Each column is defined once (its
//! header, its tooltip, what its cells hold, where it sits in the text report, which coded rows it
//! is for) and drives both the text report (`report.rs`) and the page's tables (`html/tables.rs`).

use super::findings::{CodedFigures, CodedRow, ExpertRow, Finding, Int8Row, NormRow};
use super::names::{kind_of, layer_of};

/// What a column's cells hold; the text report and the page each write a kind their own way.
pub enum Content<R> {
    /// The tensor name.
    Name(fn(&R) -> &str),
    /// A figure to `digits` decimals, or none.
    Figure { digits: usize, value: fn(&R) -> Option<f64> },
    /// A count out of a whole.
    Fraction(fn(&R) -> Fraction),
    /// A word or two, left-aligned.
    Words(fn(&R) -> String),
    /// "ok", or the row's failures.
    Verdict,
}

/// `part/whole`; the page sorts it by `key`.
pub struct Fraction {
    pub part: u64,
    pub whole: u64,
    pub key: u64,
}

/// Where a column sits in the text report.
#[derive(Clone, Copy)]
pub struct TextLayout {
    /// Spaces before the column.
    pub gap: usize,
    pub width: usize,
    pub left: bool,
    /// Figures show their sign.
    pub signed: bool,
}

impl TextLayout {
    const fn right(width: usize) -> Self {
        TextLayout { gap: 1, width, left: false, signed: false }
    }

    const fn left(width: usize) -> Self {
        TextLayout { gap: 1, width, left: true, signed: false }
    }

    const fn gap(self, gap: usize) -> Self {
        TextLayout { gap, ..self }
    }

    const fn signed(self) -> Self {
        TextLayout { signed: true, ..self }
    }
}

/// Which rows of the coded tables a column is for: an expert of a stack shares the tensor's
/// figures, not its layer, kind, K or inner σ.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    All,
    Tensors,
    Experts,
}

pub struct Column<R> {
    pub head: &'static str,
    /// The header's tooltip on the page.
    pub hint: &'static str,
    pub content: Content<R>,
    /// Where the column sits in the text report; `None`: on the page only.
    pub text: Option<TextLayout>,
    pub rows: Rows,
}

impl<R> Column<R> {
    fn new(head: &'static str, hint: &'static str, content: Content<R>) -> Self {
        Column { head, hint, content, text: None, rows: Rows::All }
    }

    fn text(self, layout: TextLayout) -> Self {
        Column { text: Some(layout), ..self }
    }

    fn only(self, rows: Rows) -> Self {
        Column { rows, ..self }
    }

    pub fn on_tensor_rows(&self) -> bool {
        self.rows != Rows::Experts
    }

    pub fn on_expert_rows(&self) -> bool {
        self.rows != Rows::Tensors
    }
}

/// The first column of every table; long names push the text report's columns right.
fn tensor<R>(name: fn(&R) -> &str) -> Column<R> {
    Column::new("tensor", "output tensor name", Content::Name(name)).text(TextLayout::left(62).gap(0))
}

fn verdict<R>(hint: &'static str, gap: usize) -> Column<R> {
    Column::new("verdict", hint, Content::Verdict).text(TextLayout::left(0).gap(gap))
}

fn figure<R>(head: &'static str, hint: &'static str, digits: usize, value: fn(&R) -> Option<f64>) -> Column<R> {
    Column::new(head, hint, Content::Figure { digits, value })
}

/// A row of the coded tables: a whole linear, or one expert of a stack.
pub struct CodedLine<'a> {
    pub row: &'a CodedRow,
    pub expert: Option<&'a ExpertRow>,
}

impl<'a> CodedLine<'a> {
    pub fn tensor(row: &'a CodedRow) -> Self {
        CodedLine { row, expert: None }
    }

    pub fn expert(row: &'a CodedRow, expert: &'a ExpertRow) -> Self {
        CodedLine { row, expert: Some(expert) }
    }

    fn figures(&self) -> &'a CodedFigures {
        self.expert.map_or(&self.row.figures, |e| &e.figures)
    }

    /// A channel-scale correlation: a stack's is the mean over its experts, as the pooled sums
    /// do not make one.
    fn channel_corr(&self, get: fn(&CodedFigures) -> Option<f64>) -> Option<f64> {
        match (self.expert, self.row.experts) {
            (None, Some(_)) => mean(self.row.per_expert.iter().filter_map(|e| get(&e.figures))),
            _ => get(self.figures()),
        }
    }
}

impl Finding for CodedLine<'_> {
    fn failures(&self) -> &[String] {
        self.expert.map_or(&self.row.failures, |e| &e.failures)
    }
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The coded linears, and the experts of their stacks.
pub fn coded<'a>() -> Vec<Column<CodedLine<'a>>> {
    use TextLayout as T;
    vec![
        tensor(|l: &CodedLine| &l.row.tensor),
        figure("expert", "expert index", 0, |l: &CodedLine| l.expert.map(|e| e.expert as f64)).only(Rows::Experts),
        figure("layer", "layer index", 0, |l: &CodedLine| layer_of(&l.row.tensor).map(|l| l as f64))
            .only(Rows::Tensors),
        Column::new("kind", "projection kind", Content::Words(|l: &CodedLine| kind_of(&l.row.tensor)))
            .only(Rows::Tensors),
        figure("K", "bits per weight of the trellis code", 0, |l: &CodedLine| Some(l.row.k as f64))
            .text(T::right(2))
            .only(Rows::Tensors),
        figure("experts", "experts in the stack", 0, |l: &CodedLine| l.row.experts.map(|e| e as f64))
            .only(Rows::Tensors),
        figure("corr", "element-wise correlation with the base over live channels", 4, |l: &CodedLine| {
            l.figures().corr
        })
        .text(T::right(8).signed()),
        figure("cosine", "cosine similarity with the base", 4, |l: &CodedLine| l.figures().cosine).text(T::right(8)),
        figure("rel err", "relative Frobenius error over live channels", 4, |l: &CodedLine| l.figures().rel_err)
            .text(T::right(8)),
        figure("bound", "Shannon bound 2^-K·√(live/all)", 4, |l: &CodedLine| Some(l.figures().shannon_bound)),
        figure("ratio", "rel err / bound", 3, |l: &CodedLine| l.figures().ratio).text(T::right(6)),
        Column::new(
            "overlap",
            "tiles that keep the trellis overlap rule / tiles checked (sorts by violations)",
            Content::Fraction(|l: &CodedLine| {
                let f = l.figures();
                let bad = f.overlap_violations.min(f.tiles_checked);
                Fraction { part: f.tiles_checked - bad, whole: f.tiles_checked, key: f.overlap_violations }
            }),
        )
        .text(T::right(9)),
        Column::new(
            "pruned",
            "pruned / all output channels",
            Content::Fraction(|l: &CodedLine| {
                let f = l.figures();
                let pruned = f.pruned_channels as u64;
                Fraction { part: pruned, whole: pruned + f.live_channels as u64, key: pruned }
            }),
        )
        .text(T::right(7)),
        figure(
            "|rout|~",
            "correlation of |rout| with the base row norms (mean over experts for stacks)",
            4,
            |l: &CodedLine| l.channel_corr(|f| f.corr_rout_row_norm),
        )
        .text(T::right(7)),
        figure(
            "|rin|~",
            "correlation of |rin| with the base column norms (mean over experts for stacks)",
            4,
            |l: &CodedLine| l.channel_corr(|f| f.corr_rin_col_norm),
        ),
        figure(
            "inner σ",
            "RMS of the base in the inner domain (codebook RMS 1.2437 for 3INST/MCG)",
            4,
            |l: &CodedLine| l.figures().inner_std,
        )
        .text(T::right(7))
        .only(Rows::Tensors),
        verdict("failures, if any", 2).only(Rows::Tensors),
        verdict("failures of this expert, if any", 2).only(Rows::Experts),
    ]
}

/// The int8 pairs.
pub fn int8() -> Vec<Column<Int8Row>> {
    use TextLayout as T;
    vec![
        tensor(|r: &Int8Row| &r.tensor),
        figure("corr", "element-wise correlation with the base", 4, |r: &Int8Row| r.corr).text(T::right(8)),
        figure("rel err", "relative Frobenius error", 4, |r: &Int8Row| r.rel_err).text(T::right(8)),
        verdict("failures, if any", 2),
    ]
}

/// The norm offsets.
pub fn norms() -> Vec<Column<NormRow>> {
    use TextLayout as T;
    vec![
        tensor(|n: &NormRow| &n.tensor),
        Column::new("kind", "norm convention", Content::Words(|n: &NormRow| n.kind.to_string())),
        figure("escha", "mean of the stored norm", 3, |n: &NormRow| Some(n.escha_mean)).text(T::right(7)),
        figure("base", "mean of the base norm", 3, |n: &NormRow| Some(n.base_mean)).text(T::right(7)),
        figure("|e−b|", "mean |escha − base|", 3, |n: &NormRow| Some(n.diff)).text(T::right(8)),
        figure("|e+1−b|", "mean |escha + 1 − base|", 3, |n: &NormRow| Some(n.diff_plus_one)).text(T::right(10)),
        Column::new("matches", "which candidate matches", Content::Words(|n: &NormRow| n.verdict.to_string()))
            .text(T::left(10).gap(2)),
        verdict("failures, if any", 1),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads<'a>(on: fn(&Column<CodedLine<'a>>) -> bool) -> Vec<&'static str> {
        coded().iter().filter(|c| on(c)).map(|c| c.head).collect()
    }

    #[test]
    fn experts_share_the_tensor_s_figures_but_not_its_place() {
        let figures = ["corr", "cosine", "rel err", "bound", "ratio", "overlap", "pruned", "|rout|~", "|rin|~"];
        let tensors = [&["tensor", "layer", "kind", "K", "experts"][..], &figures, &["inner σ", "verdict"]].concat();
        let experts = [&["tensor", "expert"][..], &figures, &["verdict"]].concat();
        assert_eq!(heads(Column::on_tensor_rows), tensors);
        assert_eq!(heads(Column::on_expert_rows), experts);
    }

    #[test]
    fn the_text_report_shows_a_subset_of_the_page_s_columns() {
        let text = |heads: Vec<&'static str>| heads.join(" ");
        let coded: Vec<_> = coded().iter().filter(|c| c.on_tensor_rows() && c.text.is_some()).map(|c| c.head).collect();
        assert_eq!(text(coded), "tensor K corr cosine rel err ratio overlap pruned |rout|~ inner σ verdict");
        let norms: Vec<_> = norms().iter().filter(|c| c.text.is_some()).map(|c| c.head).collect();
        assert_eq!(text(norms), "tensor escha base |e−b| |e+1−b| matches verdict");
    }
}
