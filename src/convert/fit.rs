//! `--max-size`: the encoding of every tensor a format lets the budget choose. First the largest
//! added-error ratio over the coded linears is made as small as the bytes allow (a table, such as
//! an embedding, takes the cheapest option within the same ratio); then the bytes left go, one
//! upgrade at a time, to whichever lowers the weight-weighted sum of ratios most per byte. The plan
//! must beat each of the format's fixed recipes that fits the same bytes on both the largest and
//! the mean ratio; where the first plan does not, the largest ratio is let rise (see [`choose`]).

use super::memory::MemoryBudget;
use crate::layout::{FitRecipe, FitTensor, OutputTensor, WidthChoice, Yardsticks, TABLE_BITS};
use crate::text::human_bytes;
use anyhow::Result;
use serde::Serialize;

/// The budget of a `--max-size` run, as `--json` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetReport {
    /// SIZE, in bytes.
    pub max_size: u64,
    /// Bytes of the model files written (every `.safetensors` / `.gguf`).
    pub bytes: u64,
    /// The largest predicted added-error ratio of a coded linear (added error over `2^-K`).
    pub max_added_error_ratio: f64,
    /// The mean of the coded linears' ratios, weighted by their weights.
    pub mean_added_error_ratio: f64,
    /// The largest ratio of a table (added error over `2^-8`); 0 when every table is exact.
    pub max_table_ratio: f64,
    /// Whether the errors are weighed by an importance matrix (`--imatrix`): each column's error
    /// and square times its importance, so the ratios are importance-weighted ones.
    pub weighted_by_imatrix: bool,
    /// The format's fixed recipes whose files SIZE would hold too (as the flags that make them),
    /// each with a higher largest ratio and a mean no lower than this plan's.
    pub fixed_recipes_beaten: Vec<String>,
    /// The fixed recipes not weighed against the plan: each gives a tensor an encoding the menu
    /// does not offer (the recipe, and that tensor).
    pub fixed_recipes_off_menu: Vec<String>,
    /// `--fit-memory`: the memory, the context, and the cache and reserve taken off it for SIZE.
    #[serde(flatten)]
    pub memory: Option<MemoryBudget>,
}

/// SIZE is below the smallest output the format can make.
#[derive(Debug)]
pub struct TooSmall {
    pub max_size: u64,
    pub smallest: u64,
}

impl std::fmt::Display for TooSmall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--max-size {} ({}): the smallest output this format can make is {} bytes ({}), every quantized tensor \
             at its narrowest; nothing was written",
            self.max_size,
            human_bytes(self.max_size),
            self.smallest,
            human_bytes(self.smallest)
        )
    }
}

impl std::error::Error for TooSmall {}

impl BudgetReport {
    /// The budget in words, for the model card.
    pub fn words(&self) -> String {
        let tables = if self.max_table_ratio == 0.0 {
            "int8 tables kept exact".to_string()
        } else {
            format!("no table more than {:.2}× 2^-8", self.max_table_ratio)
        };
        let beaten = match self.fixed_recipes_beaten.as_slice() {
            [] => String::new(),
            names => format!(
                "; by the same estimate, both figures are lower than those of every fixed recipe that fits the same size ({})",
                names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        let asked = match &self.memory {
            Some(m) => format!("{} (`--fit-memory`: {})", human_bytes(self.max_size), m.words()),
            None => format!("{} asked for (`--max-size`)", human_bytes(self.max_size)),
        };
        let weighted = if self.weighted_by_imatrix {
            " (errors weighted by the importance matrix: each column's error times its importance)"
        } else {
            ""
        };
        format!(
            "the model files take {} of the {asked}; by an estimate from sampled blocks, no coded layer's \
             re-quantization adds more than {:.2}× the error its trellis quantization already had ({:.2}× on average, \
             by weight){weighted}{beaten}; {tables}",
            human_bytes(self.bytes),
            self.max_added_error_ratio,
            self.mean_added_error_ratio
        )
    }
}

/// Per menu entry, the index of its option that costs the fewest bytes (the lower error on a tie).
pub fn cheapest(menu: &[FitTensor]) -> Vec<usize> {
    menu.iter().map(|t| best_within(t, f64::INFINITY).expect("a menu entry has options")).collect()
}

/// The cheapest option of `t` whose ratio is at most `level` (the lower error on a tie).
fn best_within(t: &FitTensor, level: f64) -> Option<usize> {
    (0..t.options.len()).filter(|&i| t.ratio(i) <= level).min_by(|&a, &b| {
        let (x, y) = (&t.options[a], &t.options[b]);
        x.bytes.cmp(&y.bytes).then(x.error.total_cmp(&y.error))
    })
}

/// The assignment at ratio `level`: each coded linear its cheapest option within it (`None` when
/// one has none); each table `tables`' option where given, else its cheapest within the level,
/// or its most exact when none is (a table never rules a level out: its narrow options join the
/// levels, so the search reaches them only when the size demands it).
fn at_level(menu: &[FitTensor], level: f64, tables: Option<&[usize]>) -> Option<Vec<usize>> {
    menu.iter()
        .enumerate()
        .map(|(n, t)| match (best_within(t, level), tables) {
            (found, _) if t.coded() => found,
            (_, Some(tables)) => Some(tables[n]),
            (found, None) => Some(found.unwrap_or_else(|| most_exact(t))),
        })
        .collect()
}

/// Each table's option as [`at_level`] chooses it (a coded linear's entry is left 0: [`at_level`]
/// chooses those), to hold the tables there while the coded linears' level moves.
fn tables_at(menu: &[FitTensor], level: f64) -> Vec<usize> {
    menu.iter().map(|t| if t.coded() { 0 } else { best_within(t, level).unwrap_or_else(|| most_exact(t)) }).collect()
}

/// The distinct finite ratios of `entries`' options, ascending: the levels a search runs over.
fn levels_of<'a>(entries: impl Iterator<Item = &'a FitTensor>) -> Vec<f64> {
    let mut levels: Vec<f64> =
        entries.flat_map(|t| (0..t.options.len()).map(move |i| t.ratio(i))).filter(|r| r.is_finite()).collect();
    levels.sort_by(f64::total_cmp);
    levels.dedup();
    levels
}

fn most_exact(t: &FitTensor) -> usize {
    (0..t.options.len())
        .min_by(|&a, &b| t.options[a].error.total_cmp(&t.options[b].error))
        .expect("a menu entry has options")
}

fn bytes(menu: &[FitTensor], choice: &[usize]) -> u64 {
    menu.iter().zip(choice).map(|(t, &i)| t.options[i].bytes).sum()
}

/// The smallest assignment: every tensor at its cheapest, the tables too (as low as the menu goes).
pub fn smallest(menu: &[FitTensor]) -> Vec<usize> {
    cheapest(menu)
}

/// The largest ratio of the coded linears (of every entry when none is coded).
pub fn largest_ratio(menu: &[FitTensor], choice: &[usize]) -> f64 {
    let any_coded = menu.iter().any(FitTensor::coded);
    menu.iter().zip(choice).filter(|(t, _)| t.coded() || !any_coded).map(|(t, &i)| t.ratio(i)).fold(0.0, f64::max)
}

/// The weight-weighted mean ratio of the coded linears.
pub fn mean_ratio(menu: &[FitTensor], choice: &[usize]) -> f64 {
    let (mut sum, mut weights) = (0.0, 0.0);
    for (t, &i) in menu.iter().zip(choice).filter(|(t, _)| t.coded()) {
        sum += t.weights as f64 * t.ratio(i);
        weights += t.weights as f64;
    }
    if weights > 0.0 {
        sum / weights
    } else {
        0.0
    }
}

/// The largest ratio of the tables.
pub fn largest_table_ratio(menu: &[FitTensor], choice: &[usize]) -> f64 {
    menu.iter().zip(choice).filter(|(t, _)| !t.coded()).map(|(t, &i)| t.ratio(i)).fold(0.0, f64::max)
}

/// The assignment for `allowance` bytes of menu tensors; `None` when even the smallest exceeds it.
///
/// The largest ratio is made as small as the bytes allow, the bytes left then spent where they
/// lower the weighted sum most. The plan must also beat each of `rivals` (the format's fixed
/// recipes whose files fit the same size): a lower largest ratio, and a mean no higher. Where the smallest
/// largest ratio costs more mean than such a recipe, the largest ratio is let rise (never to the
/// recipe's) until the mean is low enough; where the recipe reaches its size by squeezing the
/// tables (which the plan holds to the layers' ratio), the plan gives up table bytes too, as few
/// as beating it takes, then the recipe's own tables; failing all, the recipe itself is the start:
/// its worst tensors are raised as far as other tensors' downgrades pay for without raising its
/// mean ([`traded`]), and the bytes left are spent.
pub fn choose(menu: &[FitTensor], allowance: u64, rivals: &[FitRecipe]) -> Option<Vec<usize>> {
    // The tables' ratios are levels too: past the coded linears' narrowest, the largest ratio
    // rises through them until the tables fit.
    let levels = levels_of(menu.iter());
    // Bytes fall as the level rises: the lowest level whose assignment fits, and its plan.
    let fits =
        |level: f64, tables: Option<&[usize]>| at_level(menu, level, tables).filter(|c| bytes(menu, c) <= allowance);
    let lowest = |tables: Option<&[usize]>| levels.partition_point(|&level| fits(level, tables).is_none());
    let plan = |level: f64, tables: Option<&[usize]>| {
        let mut choice = fits(level, tables).expect("every level above the lowest fits");
        spend(menu, &mut choice, allowance);
        choice
    };
    let own = levels.get(lowest(None)).map(|&level| plan(level, None));
    let Some(rival_largest) = rivals.iter().map(|r| largest_ratio(menu, &r.choice)).min_by(f64::total_cmp) else {
        return own.or_else(|| {
            let mut choice = Some(smallest(menu)).filter(|c| bytes(menu, c) <= allowance)?;
            spend(menu, &mut choice, allowance);
            Some(choice)
        });
    };
    let mean_of = |c: &[usize]| mean_ratio(menu, c);
    let best_mean = rivals.iter().min_by(|a, b| mean_of(&a.choice).total_cmp(&mean_of(&b.choice)))?;
    // Both means are estimates from sampled rows, and the promise is about the measured ones: the
    // plan's is held a margin under the rival's.
    let rival_mean = mean_of(&best_mean.choice) * (1.0 - MEAN_MARGIN);
    let beats = |c: &[usize]| largest_ratio(menu, c) < rival_largest && mean_of(c) <= rival_mean;
    if let Some(own) = own.filter(|c| beats(c)) {
        return Some(own);
    }
    // The mean falls, by and large, as the largest ratio is let rise: the lowest level below the
    // rivals' largest whose plan beats them.
    let below = levels.partition_point(|&level| level < rival_largest);
    let search = |tables: Option<&[usize]>| {
        let (mut lo, mut hi) = (lowest(tables), below);
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if mean_of(&plan(levels[mid], tables)) <= rival_mean {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        levels[..below].get(lo).map(|&level| plan(level, tables)).filter(|c| beats(c))
    };
    // Failing that, the tables give up bytes too, as few as beating the rivals takes: the least
    // table level at which a plan beats them (a higher one leaves the layers more bytes), so that a
    // table is not squeezed harder than beating the recipe needs.
    let squeezed_tables = || {
        let table_levels = levels_of(menu.iter().filter(|t| !t.coded()));
        let beaten_at = |level: f64| search(Some(&tables_at(menu, level)));
        let first = table_levels.partition_point(|&level| beaten_at(level).is_none());
        table_levels.get(first).and_then(|&level| beaten_at(level))
    };
    search(None).or_else(squeezed_tables).or_else(|| search(Some(&best_mean.choice))).or_else(|| {
        // The recipe's files fit; its tensors' bytes may still pass the allowance, which takes the
        // plan's own headers off SIZE.
        let mut choice = best_mean.choice.clone();
        if bytes(menu, &choice) <= allowance {
            // The lowest level under the recipe's largest ratio that a trade reaches.
            let coded_levels = levels_of(menu.iter().filter(|t| t.coded()));
            let worst = largest_ratio(menu, &choice);
            let own = coded_levels.partition_point(|&level| level < worst);
            let traded_at = |level: f64| traded(menu, &choice, allowance, level);
            let first = coded_levels[..own].partition_point(|&level| traded_at(level).is_none());
            if let Some(better) = coded_levels[..own].get(first).and_then(|&level| traded_at(level)) {
                choice = better;
            }
            spend(menu, &mut choice, allowance);
        }
        Some(choice)
    })
}

/// `recipe` (within `allowance`) with every coded linear at `level` or above moved to its cheapest
/// option under it, paid for by downgrading other coded linears, those that raise the weighted sum
/// least per byte freed first (none to `level` or past it; the tables keep the recipe's options).
/// `None` when the bytes cannot be found, or when the changed tensors' weighted sum is not at least
/// [`MEAN_MARGIN`] under the recipe's for them: the tensors left alone keep the recipe's bytes,
/// and only the changed ones' estimates can err.
fn traded(menu: &[FitTensor], recipe: &[usize], allowance: u64, level: f64) -> Option<Vec<usize>> {
    let mut choice = recipe.to_vec();
    let mut moved = vec![false; menu.len()];
    for (n, t) in menu.iter().enumerate().filter(|(n, t)| t.coded() && t.ratio(recipe[*n]) >= level) {
        choice[n] = (0..t.options.len()).filter(|&i| t.ratio(i) < level).min_by_key(|&i| t.options[i].bytes)?;
        moved[n] = true;
    }
    // Each other coded linear's downgrade that costs the weighted sum least per byte it frees.
    let mut downgrades: Vec<(f64, usize, usize)> = menu
        .iter()
        .enumerate()
        .filter(|&(n, t)| t.coded() && !moved[n])
        .filter_map(|(n, t)| {
            let now = &t.options[recipe[n]];
            (0..t.options.len())
                .filter(|&i| t.options[i].bytes < now.bytes && t.ratio(i) < level)
                .map(|i| {
                    let freed = (now.bytes - t.options[i].bytes) as f64;
                    (t.weights as f64 * (t.ratio(i) - t.ratio(recipe[n])) / freed, n, i)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
        })
        .collect();
    downgrades.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut downgrades = downgrades.into_iter();
    let mut total = bytes(menu, &choice);
    while total > allowance {
        let (_, n, i) = downgrades.next()?;
        total -= menu[n].options[recipe[n]].bytes - menu[n].options[i].bytes;
        choice[n] = i;
    }
    let weighed = |c: &[usize], n: usize| menu[n].weights as f64 * menu[n].ratio(c[n]);
    let changed = (0..menu.len()).filter(|&n| choice[n] != recipe[n]);
    let (was, now) = changed.fold((0.0, 0.0), |(was, now), n| (was + weighed(recipe, n), now + weighed(&choice, n)));
    (now <= was * (1.0 - MEAN_MARGIN)).then_some(choice)
}

/// How far under a rival's estimated mean ratio a plan's must be to count as beating it.
const MEAN_MARGIN: f64 = 0.01;

/// Spends the bytes left on the upgrades that lower `Σ weights · ratio` most per byte.
fn spend(menu: &[FitTensor], choice: &mut [usize], allowance: u64) {
    let mut left = allowance - bytes(menu, choice);
    loop {
        let mut best: Option<(f64, usize, usize)> = None;
        for (n, t) in menu.iter().enumerate() {
            let now = &t.options[choice[n]];
            for (i, o) in t.options.iter().enumerate() {
                if o.error >= now.error || o.bytes > now.bytes + left {
                    continue;
                }
                let gain = t.weights as f64 * (t.ratio(choice[n]) - t.ratio(i));
                let per_byte = gain / (o.bytes.saturating_sub(now.bytes).max(1)) as f64;
                if best.is_none_or(|(b, _, _)| per_byte > b) {
                    best = Some((per_byte, n, i));
                }
            }
        }
        let Some((_, n, i)) = best else { return };
        left = left + menu[n].options[choice[n]].bytes - menu[n].options[i].bytes;
        choice[n] = i;
    }
}

/// Blocks of rows read per tensor to measure its options (evenly spread; the whole tensor when it
/// has fewer).
pub const SAMPLE_BLOCKS: usize = 8;

/// Of those blocks' rows, every this many is encoded to measure a type with no range estimate
/// (`IQ4_XS`, `IQ4_NL`: an encode and a decode, about 10 ns a weight with a vector kernel and 100 to
/// 200 without), so that measuring them costs less than the range estimates of the other types.
pub const MEASURED_ROW_STEP: usize = 16;

/// Chooses every menu tensor's option within `max_size` bytes of model files, as
/// `model_bytes` (the plan's exact file sizes) counts them, and applies it to `tensors` with
/// `apply`. Fails, naming the smallest size, when even the smallest assignment exceeds it.
pub fn fit(
    menu: &[FitTensor],
    yardsticks: &Yardsticks,
    tensors: &mut [OutputTensor],
    max_size: u64,
    weighted_by_imatrix: bool,
    apply: impl Fn(&mut [OutputTensor], &FitTensor, usize),
    model_bytes: impl Fn(&[OutputTensor]) -> Result<u64>,
) -> Result<(Vec<WidthChoice>, BudgetReport)> {
    let set = |tensors: &mut [OutputTensor], choice: &[usize]| {
        for (t, &i) in menu.iter().zip(choice) {
            apply(tensors, t, i);
        }
    };
    let mut least = smallest(menu);
    set(tensors, &least);
    let mut least_bytes = model_bytes(tensors)?;
    // The recipes whose files fit SIZE, to be beaten. One may be smaller than the plan's own
    // smallest: it squeezes the tables, which the plan holds to the layers' ratio.
    let mut rivals = Vec::new();
    for r in &yardsticks.recipes {
        set(tensors, &r.choice);
        let b = model_bytes(tensors)?;
        if b < least_bytes {
            (least, least_bytes) = (r.choice.clone(), b);
        }
        if b <= max_size {
            rivals.push(r.clone());
        }
    }
    if least_bytes > max_size {
        return Err(TooSmall { max_size, smallest: least_bytes }.into());
    }
    // What the menu does not choose (headers, metadata, alignment, other tensors) barely moves
    // with the choice: plan, measure the file sizes, and take any overshoot off the allowance.
    let overhead = least_bytes - bytes(menu, &least);
    let mut allowance = max_size - overhead;
    let (mut choice, mut total) = (least.clone(), least_bytes);
    for _ in 0..16 {
        let Some(c) = choose(menu, allowance, &rivals) else { break };
        set(tensors, &c);
        let b = model_bytes(tensors)?;
        if b <= max_size {
            (choice, total) = (c, b);
            break;
        }
        // This assignment's own overhead, taken off its tensors' bytes: the next one is smaller.
        allowance = bytes(menu, &c).saturating_sub(b - max_size);
    }
    set(tensors, &choice);
    let level = largest_ratio(menu, &choice);
    let widths = menu
        .iter()
        .zip(&choice)
        .map(|(t, &i)| {
            let o = &t.options[i];
            WidthChoice {
                tensor: t.name.clone(),
                k: t.k.unwrap_or(TABLE_BITS),
                chosen: o.chosen.clone(),
                bits_per_weight: 8.0 * o.bytes as f64 / t.weights.max(1) as f64,
                budget: level * t.reference(),
                predicted: o.error,
                actual: None,
                estimate: None,
                group_size: o.group_size,
                bytes: Some(o.bytes),
                ratio: Some(t.ratio(i)),
            }
        })
        .collect();
    let mean = mean_ratio(menu, &choice);
    let fixed_recipes_beaten = rivals
        .iter()
        .filter(|r| level < largest_ratio(menu, &r.choice) && mean <= mean_ratio(menu, &r.choice))
        .map(|r| r.name.clone())
        .collect();
    let report = BudgetReport {
        max_size,
        bytes: total,
        max_added_error_ratio: level,
        mean_added_error_ratio: mean,
        max_table_ratio: largest_table_ratio(menu, &choice),
        weighted_by_imatrix,
        fixed_recipes_beaten,
        fixed_recipes_off_menu: yardsticks.off_menu.clone(),
        memory: None,
    };
    Ok((widths, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Chosen, FitOption};
    use crate::storage::Storage;
    use safetensors::Dtype;

    fn entry(k: Option<u32>, weights: u64, options: &[(u64, f64)]) -> FitTensor {
        let options = options
            .iter()
            .map(|&(bytes, error)| FitOption {
                chosen: Chosen::Bits(0),
                group_size: None,
                storage: Storage::Element(Dtype::BF16),
                lossless: false,
                bytes,
                error,
            })
            .collect();
        FitTensor { index: 0, name: String::new(), k, weights, options }
    }

    #[test]
    fn the_largest_ratio_falls_first_then_the_rest_goes_where_it_helps_most() {
        // Two coded linears at K=2 (ratios are errors over 0.25) and one table.
        let menu = [
            entry(Some(2), 100, &[(10, 0.5), (20, 0.2), (30, 0.1)]),
            entry(Some(2), 100, &[(10, 0.3), (20, 0.25), (30, 0.1)]),
            entry(None, 100, &[(5, 0.01), (8, 0.0)]),
        ];
        assert_eq!(smallest(&menu), vec![0, 0, 0], "the floor is every tensor at its narrowest, the table too");
        assert_eq!(choose(&menu, 24, &[]), None);
        assert_eq!(choose(&menu, 27, &[]), Some(vec![0, 0, 0]));
        // The table stays exact at any ratio the layers reach, as soon as the bytes allow it.
        assert_eq!(choose(&menu, 28, &[]), Some(vec![0, 0, 1]));
        // 38 bytes: the first linear's 0.5 is the largest error; it moves first.
        assert_eq!(choose(&menu, 38, &[]), Some(vec![1, 0, 1]));
        // 48: both at 20 bytes would leave the largest at 0.25; 30 + 10 leaves 0.3.
        assert_eq!(choose(&menu, 48, &[]), Some(vec![1, 1, 1]));
        assert_eq!(choose(&menu, 1000, &[]), Some(vec![2, 2, 1]));
    }

    #[test]
    fn a_table_takes_the_cheapest_option_within_the_layers_ratio() {
        let menu = [entry(Some(2), 10, &[(10, 0.5)]), entry(None, 10, &[(5, 0.0079), (8, 0.0)])];
        // 0.0079 / 2^-8 ≈ 2.02 > 0.5 / 0.25 = 2: the table may not take it while it has room.
        assert_eq!(choose(&menu, 18, &[]), Some(vec![0, 1]));
        // Only a size that demands it narrows the table.
        assert_eq!(choose(&menu, 17, &[]), Some(vec![0, 0]));
    }

    fn recipe(choice: &[usize]) -> FitRecipe {
        FitRecipe { name: String::new(), choice: choice.to_vec() }
    }

    #[test]
    fn a_fixed_recipe_of_the_same_size_is_beaten_on_the_mean_too() {
        // Ratios over 0.25 (K=2): A's 3.0, 2.0, 1.0; B's (a hundred times the weights) 1.5, 0.5.
        let menu =
            [entry(Some(2), 1, &[(10, 0.75), (25, 0.5), (40, 0.25)]), entry(Some(2), 100, &[(10, 0.375), (20, 0.125)])];
        // The smallest largest ratio in 50 bytes is 1.5 (A at 40 bytes, B at 10): mean 1.495.
        assert_eq!(choose(&menu, 50, &[]), Some(vec![2, 0]));
        // A recipe of 30 bytes has the mean 0.525 (A at 3.0, B at 0.5): the plan lets the largest
        // ratio rise to 2.0, still below the recipe's 3.0, and spends the rest on B: mean 0.515.
        assert_eq!(choose(&menu, 50, &[recipe(&[0, 1])]), Some(vec![1, 1]));
    }

    #[test]
    fn a_recipe_that_squeezes_a_table_is_matched_table_for_table() {
        // Two K=2 linears and a table whose narrow option (5 bytes) is 2.56× 2^-8; the recipe takes
        // it, and for B the worse of two 20-byte options.
        let menu = [
            entry(Some(2), 100, &[(10, 0.5), (20, 0.2)]),
            entry(Some(2), 100, &[(10, 0.5), (20, 0.2125), (20, 0.225)]),
            entry(None, 100, &[(5, 0.01), (8, 0.0)]),
        ];
        // Holding the table exact, 45 bytes buy only one of the linears its 20-byte option.
        assert_eq!(choose(&menu, 45, &[]), Some(vec![1, 0, 1]));
        // Beside the recipe (largest ratio 0.9), the plan squeezes the table as it does: 0.85.
        assert_eq!(choose(&menu, 45, &[recipe(&[1, 2, 0])]), Some(vec![1, 1, 0]));
    }

    #[test]
    fn a_recipe_s_worst_tensor_is_raised_with_the_bytes_of_the_downgrades_that_cost_least() {
        // K=2, ratios over 0.25: A 3.0 or 1.0; B 1.8 or 0.8; C 1.6 or 0.5. The recipe (40 bytes)
        // leaves A at 3.0.
        let menu = [
            entry(Some(2), 1, &[(10, 0.75), (20, 0.25)]),
            entry(Some(2), 1, &[(5, 0.45), (15, 0.2)]),
            entry(Some(2), 1, &[(5, 0.4), (15, 0.125)]),
        ];
        let recipe = [0, 1, 1];
        // Under 2.0, A's 10 more bytes come from B, whose downgrade costs 0.1 a byte (C's 0.11).
        assert_eq!(traded(&menu, &recipe, 40, 2.0), Some(vec![1, 0, 1]));
        // Under 1.7, B's 1.8 is barred: C pays.
        assert_eq!(traded(&menu, &recipe, 40, 1.7), Some(vec![1, 1, 0]));
        // Under 1.55 neither may pay; under 1.0 A has no option.
        assert_eq!(traded(&menu, &recipe, 40, 1.55), None);
        assert_eq!(traded(&menu, &recipe, 40, 1.0), None);
        // A payer whose weights make its downgrade cost more than A's gain is no trade.
        let heavy = [menu[0].clone(), entry(Some(2), 10, &[(5, 0.45), (15, 0.2)])];
        assert_eq!(traded(&heavy, &[0, 1], 25, 2.0), None);
    }

    #[test]
    fn tables_give_up_no_more_bytes_than_beating_a_squeezing_recipe_takes() {
        // Two K=2 linears (ratios over 0.25) and two tables (over 2^-8) whose narrow options are
        // 5.12 and 7.68; the recipe squeezes both, and B takes the worse of two 20-byte options.
        let menu = [
            entry(Some(2), 1000, &[(10, 0.5), (20, 0.2), (25, 0.1)]),
            entry(Some(2), 1000, &[(10, 0.5), (20, 0.2125), (20, 0.225)]),
            entry(None, 10, &[(3, 0.02), (8, 0.0)]),
            entry(None, 10, &[(3, 0.03), (8, 0.0)]),
        ];
        // Both tables exact leave 35 bytes: one linear stays at 2.0, above the recipe's 0.9.
        // Squeezing the first table alone beats the recipe (0.85 largest, 0.825 mean against 0.9
        // and 0.85); copying the recipe's tables would have spent the second's bytes on A.
        assert_eq!(choose(&menu, 51, &[recipe(&[1, 2, 0, 0])]), Some(vec![1, 1, 0, 1]));
    }
}
