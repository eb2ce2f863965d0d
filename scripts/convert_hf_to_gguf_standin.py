"""Runs llama.cpp's convert_hf_to_gguf.py with one patch: the fixtures' stand-in tokenizer is not in
the converter's table of pre-tokenizers, so get_vocab_base_pre answers for it what it answers for
the real Qwen3.5 tokenizers ("qwen35"), for qwen35 and qwen35moe only. Everything else is the
converter's own. Used by tests/python/test_gguf.py and scripts/bench-gguf.sh.

    python scripts/convert_hf_to_gguf_standin.py PATH/TO/convert_hf_to_gguf.py ARGS...
"""
import runpy
import sys
from pathlib import Path

script = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(script.parent))
sys.path.insert(1, str(script.parent / "gguf-py"))
import gguf  # noqa: E402  (the converter's own gguf-py)
from conversion import base  # noqa: E402

original = base.TextModel.get_vocab_base_pre


def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        if self.model_arch in (gguf.MODEL_ARCH.QWEN35, gguf.MODEL_ARCH.QWEN35MOE):
            print("convert_hf_to_gguf_standin: the stand-in tokenizer is not in the converter's table; "
                  "tokenizer.ggml.pre = qwen35, as for the real Qwen3.5 tokenizers", file=sys.stderr)
            return "qwen35"
        raise


base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
