"""The checkpoint a case mutates: JSON written with raw values, safetensors shards as editable
lists, and the copied fixture with helpers that keep the index in step."""

import json
import re
import struct

PREFIX = "model.language_model."
MIB = 1 << 20

# ---- JSON helpers ------------------------------------------------------------------------------


class Raw:
    """A JSON value written as given (e.g. 1e400, NaN, a lone surrogate escape)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def dumps(value):
    """json.dumps, with Raw values spliced in as their text."""
    raws = []

    def default(o):
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"\u0001RAW{len(raws) - 1}\u0001"
        raise TypeError(type(o))

    text = json.dumps(value, default=default, ensure_ascii=False)
    for i, r in enumerate(raws):
        text = text.replace(json.dumps(f"\u0001RAW{i}\u0001"), r)
    return text


def short(value, n=60):
    s = dumps(value) if not isinstance(value, Raw) else value.text
    return s if len(s) <= n else f"{s[:n]}… ({len(s)} chars)"


# ---- safetensors -------------------------------------------------------------------------------


class Shard:
    """A safetensors file as metadata plus a list of [name, dtype, shape, bytes], in data order."""

    def __init__(self, path):
        b = path.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8 : 8 + n])
        data = b[8 + n :]
        self.meta = header.pop("__metadata__", None)
        self.tensors = []
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            a, z = t["data_offsets"]
            self.tensors.append([name, t["dtype"], list(t["shape"]), data[a:z]])

    def find(self, name):
        for t in self.tensors:
            if t[0] == name:
                return t
        return None

    def write(self, path):
        header = {}
        if self.meta is not None:
            header["__metadata__"] = self.meta
        off = 0
        for name, dtype, shape, data in self.tensors:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
        text = dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in self.tensors))


NP = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "i1", "U8": "u1", "I16": "<i2", "I32": "<i4"}


# ---- the checkpoint of one case ----------------------------------------------------------------


class Ck:
    """The copied fixture a case mutates, with helpers that keep the index in step."""

    def __init__(self, root, fixture):
        self.root = root
        self.fixture = fixture

    # JSON side files
    def load(self, name):
        try:
            return json.loads((self.root / name).read_text())
        except (OSError, ValueError):
            return None

    def save(self, name, value):
        (self.root / name).write_text(dumps(value))

    def config(self):
        return self.load("config.json")

    @staticmethod
    def text(cfg):
        tc = cfg.get("text_config") if isinstance(cfg, dict) else None
        return tc if isinstance(tc, dict) else cfg

    # shards
    def shard_paths(self):
        paths = sorted(self.root.glob("*.safetensors"))
        if (self.root / "mtp" / "model.safetensors").is_file():
            paths.append(self.root / "mtp" / "model.safetensors")
        return paths

    def main_shards(self):
        return sorted(self.root.glob("*.safetensors"))

    def all_tensors(self, mtp=True):
        """(shard path, tensor name, dtype, shape) of every tensor whose shard still parses."""
        out = []
        for p in self.shard_paths() if mtp else self.main_shards():
            try:
                s = Shard(p)
            except (ValueError, KeyError, TypeError, struct.error):
                continue
            out += [(p, t[0], t[1], t[2]) for t in s.tensors]
        return out

    def edit_shard(self, path, fn):
        s = Shard(path)
        result = fn(s)
        s.write(path)
        return result

    def index_edit(self, fn):
        """Applies fn(weight_map) to the index, when the shard is listed in one."""
        idx = self.load("model.safetensors.index.json")
        if isinstance(idx, dict) and isinstance(idx.get("weight_map"), dict):
            fn(idx["weight_map"])
            self.save("model.safetensors.index.json", idx)

    def pick_tensor(self, rng, pattern=".", mtp=True, dtypes=None):
        cands = [t for t in self.all_tensors(mtp) if re.search(pattern, t[1]) and (dtypes is None or t[2] in dtypes)]
        return rng.choice(cands) if cands else None

    def rel(self, path):
        return str(path.relative_to(self.root))


def layer_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None
