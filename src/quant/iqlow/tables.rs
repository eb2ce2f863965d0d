//! The lookup tables ggml's IQ2/IQ3 encoders search, built from the grids once, on first use, as
//! `iq2xs_init_impl` / `iq3xs_init_impl` build them: each grid point as odd levels `2l + 1`, and
//! for every point of the lattice the encoders can reach, either its index in the grid or the list
//! of grid points nearest to it (those at the `want` smallest squared distances, by distance and
//! then by index, the order ggml's sort leaves them in and so the order its search breaks ties in).
//! Each list is also held as its points' values column by column, [`COLUMN`] points at a time, so
//! that the lane-wise search (`lanes.rs`) loads one value of 8 candidates as 8 consecutive bytes.

use super::grids::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID};
use std::sync::OnceLock;

/// One grid and its neighbour lists.
pub(super) struct Table {
    /// Values per grid point: 8 (IQ2) or 4 (IQ3).
    pub cell: usize,
    /// Bits per value in a lattice index: 2 (IQ2) or 3 (IQ3).
    bits: u32,
    /// The levels a value can take, `0..levels` (3 for IQ2, 8 for IQ3).
    pub levels: i32,
    /// Grid point `j`'s values as `2l + 1`, at `cell·j..cell·(j + 1)`.
    points: Vec<i8>,
    /// Per lattice index: the grid index (≥ 0), `-(k + 1)` where `lists[k]` is its list of
    /// neighbours, or [`UNREACHABLE`] for an index with a level beyond `levels − 1` (ggml lists
    /// those too; no encoder can look them up).
    map: Vec<i32>,
    /// Per list: where its grid indexes start in `neighbours` (after their count), that count, and
    /// where its runs start in `columns`.
    lists: Vec<(u32, u32, u32)>,
    neighbours: Vec<u16>,
    /// Per list, per run of [`COLUMN`] of its points (the last run padded with its last point):
    /// value `i` of the run's points at `cell·COLUMN·run + COLUMN·i..`, as `2l + 1`.
    columns: Vec<i8>,
}

/// Points per run of [`Neighbours::columns`]: one per f32 lane of the lane-wise search.
pub(super) const COLUMN: usize = 8;

/// The map entry of a lattice index no encoder can form.
const UNREACHABLE: i32 = i32::MIN;

/// Where a lattice point lies: on the grid, or off it with the grid points to try.
pub(super) enum Lookup<'a> {
    On(usize),
    Off(Neighbours<'a>),
}

/// The grid points to try for a point off the grid, nearest first.
#[derive(Clone, Copy)]
pub(super) struct Neighbours<'a> {
    /// Their grid indexes.
    pub list: &'a [u16],
    /// Their values, [`COLUMN`] points at a time, as the table's `columns`.
    pub columns: &'a [i8],
}

impl Table {
    fn build(grid: &[u16], cell: usize, bits: u32, levels: i32, want: usize) -> Table {
        let mask = (1u32 << bits) - 1;
        let points: Vec<i8> = grid
            .iter()
            .flat_map(|&g| (0..cell).map(move |i| (2 * ((u32::from(g) >> (bits * i as u32)) & mask) + 1) as i8))
            .collect();
        let size = 1usize << (bits as usize * cell);
        let mut map = vec![UNREACHABLE; size];
        for (j, &g) in grid.iter().enumerate() {
            map[usize::from(g)] = j as i32;
        }
        let (mut lists, mut neighbours, mut columns) = (Vec::new(), Vec::new(), Vec::new());
        let mut d2 = vec![0i32; grid.len()];
        for (index, entry) in map.iter_mut().enumerate() {
            let digits: Vec<u32> = (0..cell).map(|k| (index as u32 >> (bits * k as u32)) & mask).collect();
            if *entry != UNREACHABLE || digits.iter().any(|&l| l as i32 >= levels) {
                continue;
            }
            for (j, d) in d2.iter_mut().enumerate() {
                *d = (0..cell)
                    .map(|k| {
                        let diff = i32::from(points[cell * j + k]) - (2 * digits[k] as i32 + 1);
                        diff * diff
                    })
                    .sum();
            }
            *entry = -(lists.len() as i32 + 1);
            let start = neighbours.len();
            neighbours.push(0);
            // The `want` smallest distances in increasing order, each one's points by index.
            let mut floor = -1;
            for _ in 0..want {
                let Some(next) = d2.iter().copied().filter(|&d| d > floor).min() else { break };
                neighbours.extend((0..grid.len()).filter(|&j| d2[j] == next).map(|j| j as u16));
                floor = next;
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
            lists.push((start as u32 + 1, u32::from(neighbours[start]), columns.len() as u32));
            for run in neighbours[start + 1..].chunks(COLUMN) {
                for i in 0..cell {
                    columns.extend((0..COLUMN).map(|k| points[cell * usize::from(run[k.min(run.len() - 1)]) + i]));
                }
            }
        }
        Table { cell, bits, levels, points, map, lists, neighbours, columns }
    }

    /// Grid point `j`'s values as odd levels `2l + 1`.
    pub fn point(&self, j: usize) -> &[i8] {
        &self.points[self.cell * j..self.cell * (j + 1)]
    }

    /// Where the point of levels `l` (each in `0..levels`) lies.
    #[inline]
    pub fn lookup(&self, l: &[i8]) -> Lookup<'_> {
        let index = l.iter().enumerate().fold(0usize, |u, (k, &v)| u | (v as usize) << (self.bits as usize * k));
        match self.map.get(index) {
            Some(&j) if j >= 0 => Lookup::On(j as usize),
            Some(&m) if m != UNREACHABLE => {
                let (at, n, column) = self.lists[(-(m + 1)) as usize];
                let (at, n, column) = (at as usize, n as usize, column as usize);
                let runs = n.div_ceil(COLUMN);
                Lookup::Off(Neighbours {
                    list: &self.neighbours[at..at + n],
                    columns: &self.columns[column..column + runs * COLUMN * self.cell],
                })
            }
            _ => Lookup::Off(Neighbours { list: &[], columns: &[] }),
        }
    }

    /// Whether the point of levels `l` is a grid point: its index.
    pub fn index_of(&self, l: &[i8]) -> Option<usize> {
        match self.lookup(l) {
            Lookup::On(j) => Some(j),
            Lookup::Off(_) => None,
        }
    }
}

macro_rules! table {
    ($name:ident, $grid:expr, $cell:expr, $bits:expr, $levels:expr, $want:expr) => {
        pub(super) fn $name() -> &'static Table {
            static TABLE: OnceLock<Table> = OnceLock::new();
            TABLE.get_or_init(|| Table::build(&$grid, $cell, $bits, $levels, $want))
        }
    };
}

// ggml's `nwant`: 2 nearest distances for IQ2_XXS, IQ2_XS and IQ3_XXS's grid, 1 for IQ2_S's, 3 for
// IQ3_S's.
table!(iq2_xxs, IQ2_XXS_GRID, 8, 2, 3, 2);
table!(iq2_xs, IQ2_XS_GRID, 8, 2, 3, 2);
table!(iq2_s, IQ2_S_GRID, 8, 2, 3, 1);
table!(iq3_xxs, IQ3_XXS_GRID, 4, 3, 8, 2);
table!(iq3_s, IQ3_S_GRID, 4, 3, 8, 3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbour_tables_hold_ggml_invariants() {
        // (table, grid size, lattice points the encoders reach: levels^cell, distances listed)
        let all: [(&Table, usize, usize, usize); 5] = [
            (iq2_xxs(), 256, 6561, 2),
            (iq2_xs(), 512, 6561, 2),
            (iq2_s(), 1024, 6561, 1),
            (iq3_xxs(), 256, 4096, 2),
            (iq3_s(), 512, 4096, 3),
        ];
        for (t, size, reachable, want) in all {
            assert_eq!(t.points.len(), size * t.cell);
            // Every grid point maps to itself, and the grid's levels are in range.
            for j in 0..size {
                let l: Vec<i8> = t.point(j).iter().map(|&p| (p - 1) / 2).collect();
                assert!(l.iter().all(|&v| (0..t.levels as i8).contains(&v)));
                assert_eq!(t.index_of(&l), Some(j));
            }
            let mut off = 0;
            for index in 0..t.map.len() {
                let l: Vec<i8> =
                    (0..t.cell).map(|k| ((index >> (t.bits as usize * k)) & ((1 << t.bits) - 1)) as i8).collect();
                if l.iter().any(|&v| i32::from(v) >= t.levels) {
                    assert_eq!(t.map[index], UNREACHABLE);
                    continue;
                }
                let Lookup::Off(Neighbours { list, columns }) = t.lookup(&l) else { continue };
                off += 1;
                // The columns hold the list's points, the last repeated to fill its run.
                assert_eq!(columns.len(), list.len().div_ceil(COLUMN) * COLUMN * t.cell);
                for (r, run) in columns.chunks_exact(COLUMN * t.cell).enumerate() {
                    for k in 0..COLUMN {
                        let j = list[(COLUMN * r + k).min(list.len() - 1)];
                        let column: Vec<i8> = (0..t.cell).map(|i| run[COLUMN * i + k]).collect();
                        assert_eq!(column, t.point(usize::from(j)));
                    }
                }
                assert!(!list.is_empty(), "{index}: no neighbours");
                // Sorted by distance then index, and every point nearer than the last listed is in.
                let dist = |j: u16| -> i32 {
                    t.point(usize::from(j))
                        .iter()
                        .zip(&l)
                        .map(|(&p, &v)| (i32::from(p) - (2 * i32::from(v) + 1)).pow(2))
                        .sum()
                };
                let keys: Vec<(i32, u16)> = list.iter().map(|&j| (dist(j), j)).collect();
                assert!(keys.windows(2).all(|w| w[0] < w[1]));
                let mut distances: Vec<i32> = keys.iter().map(|k| k.0).collect();
                distances.dedup();
                assert_eq!(distances.len(), want, "{index}");
                let last = keys.last().unwrap().0;
                let nearer = (0..size as u16).filter(|&j| dist(j) <= last).count();
                assert_eq!(nearer, list.len());
            }
            assert_eq!(off + size, reachable);
        }
    }
}
