//! An opened input checkpoint: its shards (memory-mapped), the index, config.json and the side
//! files, with typed access to the values of any tensor.

use super::boundary::{input_extent, Boundary};
use super::regular::read_text;
use super::shard::{self, Shard};
use super::tensor::{floats_to_f32, view, TensorEntry};
use crate::paths::parent_dir;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Files copied verbatim from the input directory (tokenizer, chat template, generation config).
pub const COPIED_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
];

const INDEX_FILE: &str = "model.safetensors.index.json";

/// An opened checkpoint: every tensor of every shard, resolved by name.
pub struct Checkpoint {
    /// The directory or single file given by the user.
    pub root: PathBuf,
    pub shards: Vec<Shard>,
    pub tensors: BTreeMap<String, TensorEntry>,
    /// config.json, when the input is a directory that has one.
    pub config: Option<Value>,
    /// Whether the input is a single `.safetensors` file: tensors only, no config.json.
    pub single_file: bool,
    /// Side files from [`COPIED_FILES`] present next to the shards: name, resolved path.
    pub copied_files: Vec<(String, PathBuf)>,
    /// What the input says about itself beyond config.json, for the output's model card:
    /// `quantize_config.json` and the YAML front matter of its `README.md`.
    pub quantize_config: Option<Value>,
    pub card_front_matter: Option<String>,
    /// The `mtp/` subdirectory (the 27B's separate MTP head), when present, resolved; its
    /// `mtp.*` tensors are part of [`Checkpoint::tensors`].
    pub mtp_dir: Option<PathBuf>,
    /// Where IN physically is (its directory and a Hub snapshot's `blobs/`, or the one file):
    /// nothing this tool writes may overlap it.
    pub extent: Vec<PathBuf>,
}

impl Checkpoint {
    pub fn open(root: &Path) -> Result<Self> {
        let meta = std::fs::metadata(root).map_err(|e| missing_input(root, e))?;
        if meta.is_file() {
            shard::require_safetensors_name(root)?;
            refuse_lone_shard(root)?;
            // A single file follows the rules of its directory (a Hub snapshot's links included).
            let boundary = Boundary::of_file(root)?;
            let resolved = boundary.file(root)?.with_context(|| format!("{}: vanished", root.display()))?;
            let mut ck = Checkpoint::empty(root);
            ck.single_file = true;
            ck.add_shard(&resolved, None)?;
            ck.extent = input_extent(root)?;
            return Ok(ck);
        }
        let boundary = Boundary::of_dir(root)?;
        let mut ck = Self::open_dir(root, &boundary)?;
        ck.extent = boundary.extent();
        if let Some(dir) = &ck.mtp_dir {
            let mtp = Self::open_dir(dir, &boundary)?;
            ck.absorb_mtp(mtp)?;
        }
        Ok(ck)
    }

    /// Takes in the tensors of a separate MTP checkpoint: one model, with the head under the
    /// `mtp.*` names it has in Hugging Face repositories.
    fn absorb_mtp(&mut self, mtp: Checkpoint) -> Result<()> {
        let offset = self.shards.len();
        for (name, mut entry) in mtp.tensors {
            let file = mtp.shards[entry.shard].path.display();
            if !name.starts_with("mtp.") {
                bail!("{file}: tensor {name}: every tensor of the mtp/ head must be named mtp.*");
            }
            if self.tensors.contains_key(&name) {
                bail!("{file}: tensor {name} is also in the main checkpoint");
            }
            entry.shard += offset;
            self.tensors.insert(name, entry);
        }
        self.shards.extend(mtp.shards);
        Ok(())
    }

    fn empty(root: &Path) -> Checkpoint {
        Checkpoint {
            root: root.to_path_buf(),
            shards: Vec::new(),
            tensors: BTreeMap::new(),
            config: None,
            single_file: false,
            copied_files: Vec::new(),
            quantize_config: None,
            card_front_matter: None,
            mtp_dir: None,
            extent: Vec::new(),
        }
    }

    fn open_dir(root: &Path, boundary: &Boundary) -> Result<Self> {
        let mut ck = Checkpoint::empty(root);
        if let Some(config_path) = boundary.file(&root.join("config.json"))? {
            let text = read_text(&config_path)?;
            let value = serde_json::from_str(&text)
                .with_context(|| format!("{}: invalid JSON", root.join("config.json").display()))?;
            ck.config = Some(value);
        }
        if let Some(index_path) = boundary.file(&root.join(INDEX_FILE))? {
            ck.open_indexed(&root.join(INDEX_FILE), &index_path, boundary)?;
        } else {
            let mut files = Vec::new();
            for e in std::fs::read_dir(root).with_context(|| format!("{}: cannot list directory", root.display()))? {
                let path = e.with_context(|| format!("{}: cannot list directory", root.display()))?.path();
                if path.extension().is_some_and(|e| e == "safetensors") {
                    // Listed a moment ago: a shard that is gone now means IN is changing under us.
                    let resolved = boundary.file(&path)?.with_context(|| {
                        format!("{}: vanished while the checkpoint was being opened", path.display())
                    })?;
                    files.push((path, resolved));
                }
            }
            files.sort();
            if files.is_empty() {
                bail!("{}: no .safetensors files here: not a checkpoint directory", root.display());
            }
            for (_, resolved) in files {
                ck.add_shard(&resolved, None)?;
            }
        }
        for name in COPIED_FILES {
            if let Some(resolved) = boundary.file(&root.join(name))? {
                ck.copied_files.push(((*name).to_string(), resolved));
            }
        }
        if let Some(path) = boundary.file(&root.join("quantize_config.json"))? {
            ck.quantize_config = serde_json::from_str(&read_text(&path)?).ok();
        }
        if let Some(path) = boundary.file(&root.join("README.md"))? {
            ck.card_front_matter = front_matter(&read_text(&path)?);
        }
        ck.mtp_dir = boundary.dir(&root.join("mtp"))?;
        Ok(ck)
    }

    /// Opens the shards named by the index and checks that every listed tensor is where the index
    /// says.
    fn open_indexed(&mut self, index_path: &Path, resolved: &Path, boundary: &Boundary) -> Result<()> {
        let text = read_text(resolved)?;
        let index: Value =
            serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", index_path.display()))?;
        let Some(map) = index.get("weight_map").and_then(Value::as_object) else {
            bail!("{}: no \"weight_map\" object", index_path.display());
        };
        let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                bail!("{}: weight_map entry for {tensor} is not a file name", index_path.display());
            };
            by_shard.entry(file).or_default().push(tensor);
        }
        let root = index_path.parent().unwrap_or(Path::new("."));
        for (file, names) in by_shard {
            if file.is_empty() || file.contains(['/', '\\']) || file == "." || file == ".." {
                bail!("{}: shard name {file:?} points outside the checkpoint", index_path.display());
            }
            let Some(path) = boundary.file(&root.join(file))? else {
                bail!("{}: names shard {file}, which does not exist (tensor {})", index_path.display(), names[0]);
            };
            self.add_shard(&path, Some(&names))?;
        }
        Ok(())
    }

    fn add_shard(&mut self, path: &Path, expected: Option<&[&str]>) -> Result<()> {
        let (shard, entries) = Shard::open(path)?;
        let id = self.shards.len();
        if let Some(expected) = expected {
            for name in expected {
                if entries.binary_search_by(|(n, _)| n.as_str().cmp(name)).is_err() {
                    bail!("{}: tensor {name} is listed in the index but absent from this shard", path.display());
                }
            }
        }
        for (name, mut entry) in entries {
            entry.shard = id;
            if let Some(prev) = self.tensors.get(&name) {
                bail!("{}: tensor {name} also appears in {}", path.display(), self.shards[prev.shard].path.display());
            }
            self.tensors.insert(name, entry);
        }
        self.shards.push(shard);
        Ok(())
    }

    /// The bytes of a tensor.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        &self.shards[entry.shard].bytes()[entry.range.clone()]
    }

    /// The entry of tensor `name`, or an error naming it.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| anyhow::anyhow!("{}: no tensor {name}", self.root.display()))
    }

    /// Elements `range` of a float tensor (F16, BF16 or F32), widened exactly to f32 and appended
    /// to `out`.
    pub fn elements_f32(&self, name: &str, range: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        let (e, bytes) = self.elements(name, range)?;
        floats_to_f32(bytes, e.dtype, out).with_context(|| format!("tensor {name}"))
    }

    /// Rows `rows` of lead `lead` of a tensor viewed as `[leads, rows, width]`, each cut to its
    /// columns `cols`, widened to f32 and appended to `out` (`rows × cols` values).
    pub fn rows_f32(
        &self,
        name: &str,
        lead: usize,
        rows: Range<usize>,
        cols: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for run in self.row_runs(name, lead, rows, cols)? {
            self.elements_f32(name, run, out)?;
        }
        Ok(())
    }

    /// The same rows as [`Checkpoint::rows_f32`], as stored bytes appended to `out`.
    pub fn rows_bytes(
        &self,
        name: &str,
        lead: usize,
        rows: Range<usize>,
        cols: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        for run in self.row_runs(name, lead, rows, cols)? {
            self.element_bytes(name, run, out)?;
        }
        Ok(())
    }

    /// Elements `range` of any tensor as stored bytes, appended to `out`.
    pub fn element_bytes(&self, name: &str, range: Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(self.elements(name, range)?.1);
        Ok(())
    }

    /// The element ranges that hold the requested rows: one run when whole rows are read.
    fn row_runs(
        &self,
        name: &str,
        lead: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> Result<impl Iterator<Item = Range<usize>>> {
        let (leads, height, width) = view(&self.entry(name)?.shape);
        if lead >= leads || rows.start > rows.end || rows.end > height || cols.start > cols.end || cols.end > width {
            bail!("tensor {name}: rows {rows:?} × columns {cols:?} of lead {lead} are outside its {leads}×{height}×{width} view");
        }
        let first = (lead * height + rows.start) * width + cols.start;
        let (runs, len) = if cols.len() == width { (1, rows.len() * width) } else { (rows.len(), cols.len()) };
        Ok((0..runs).map(move |r| first + r * width..first + r * width + len))
    }

    /// The entry of `name` and the bytes of its elements `range`, checked against the tensor.
    fn elements(&self, name: &str, range: Range<usize>) -> Result<(&TensorEntry, &[u8])> {
        let e = self.entry(name)?;
        let el = e.dtype.bitsize() / 8;
        if el == 0 || range.start > range.end || range.end > e.numel() {
            bail!("tensor {name}: elements {range:?} are outside its {} elements ({:?})", e.numel(), e.dtype);
        }
        Ok((e, &self.bytes(e)[range.start * el..range.end * el]))
    }

    /// Fails when any shard changed since it was opened.
    pub fn check_unchanged(&self) -> Result<()> {
        self.shards.iter().try_for_each(Shard::check_unchanged)
    }

    /// Releases a tensor's pages once nothing will read it again (see [`Shard::release`]).
    pub fn release(&self, entry: &TensorEntry) {
        self.shards[entry.shard].release(entry.range.clone());
    }

    /// Releases the pages of bytes `part` of a tensor (offsets within the tensor), as
    /// [`Checkpoint::release`] does for the whole tensor.
    pub fn release_part(&self, entry: &TensorEntry, part: Range<usize>) {
        let part = part.start.min(entry.byte_len())..part.end.min(entry.byte_len());
        if !part.is_empty() {
            self.shards[entry.shard].release(entry.range.start + part.start..entry.range.start + part.end);
        }
    }

    /// Releases the pages of several tensors, neighbours in a file with one call.
    pub fn release_all<'a>(&self, entries: impl IntoIterator<Item = &'a TensorEntry>) {
        let mut ranges: Vec<(usize, Range<usize>)> = entries.into_iter().map(|e| (e.shard, e.range.clone())).collect();
        ranges.sort_unstable_by_key(|(shard, r)| (*shard, r.start));
        let mut run: Option<(usize, Range<usize>)> = None;
        for (shard, r) in ranges {
            match &mut run {
                Some((s, open)) if *s == shard && r.start <= open.end => open.end = open.end.max(r.end),
                _ => {
                    if let Some((s, open)) = run.replace((shard, r)) {
                        self.shards[s].release(open);
                    }
                }
            }
        }
        if let Some((s, open)) = run {
            self.shards[s].release(open);
        }
    }

    /// The file a tensor lives in (for error messages).
    pub fn file_of(&self, entry: &TensorEntry) -> &Path {
        &self.shards[entry.shard].path
    }

    /// The text part of the config (`text_config` when nested).
    pub fn text_config(&self) -> Option<&Value> {
        let c = self.config.as_ref()?;
        Some(c.get("text_config").unwrap_or(c))
    }
}

/// The error for an IN that cannot be read: one not there is said to be missing, with the names
/// close to it (`hub::locate` has already looked up a Hub id in the cache).
fn missing_input(root: &Path, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!("{}", super::missing::no_such_path(root, ""))
    } else {
        anyhow::Error::new(e).context(format!("{}: cannot read input", root.display()))
    }
}

/// Refuses a single file that is one shard of a larger checkpoint: converting it alone would
/// give a model with missing layers.
fn refuse_lone_shard(file: &Path) -> Result<()> {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let of_n = name
        .strip_suffix(".safetensors")
        .and_then(|s| s.rsplit_once("-of-"))
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .filter(|&n| n > 1);
    let dir = parent_dir(file);
    if of_n.is_some() || dir.join(INDEX_FILE).is_file() {
        let shards = of_n.map_or_else(|| "a checkpoint with an index".into(), |n| format!("{n} shards"));
        bail!("{}: one shard of {shards}; pass the directory {} instead", file.display(), dir.display());
    }
    Ok(())
}

/// The YAML front matter of a model card (between a first line `---` and the next `---`).
fn front_matter(card: &str) -> Option<String> {
    let rest = card.strip_prefix("---\n").or_else(|| card.strip_prefix("---\r\n"))?;
    let end = rest.find("\n---")?;
    Some(rest[..end].to_string())
}
