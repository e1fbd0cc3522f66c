"""`lt2dsl import DIR [-o model.lt2] [--weights out.safetensors]`: a local HF checkpoint → `.lt2`.

Without `-o` the program goes to stdout. A checkpoint `.lt2` cannot express is refused with an
E1001 diagnostic pointing at the config.json field (E1002: the folder or its weights do not
match its config); either exits 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lt2dsl.hf.checkpoint import open_checkpoint, save_safetensors, write_text_atomic
from lt2dsl.hf.importer import import_checkpoint
from lt2dsl.hf.refuse import Refused
from lt2dsl.source import SourceFile


def run(args: argparse.Namespace, out, err, report) -> int:
    """Import `args.dir`; `report(err, diags, sources)` prints refusals. Returns the exit code."""
    try:
        imp = import_checkpoint(args.dir)
    except Refused as r:
        path, text = _config_source(args.dir)
        report(err, [r.diagnostic(path, text)], {path: SourceFile(name=path, text=text)})
        return 1
    if args.output:
        write_text_atomic(args.output, imp.text)
        err.file.write(f"wrote {args.output}\n")
    else:
        out.file.write(imp.text)
    if args.weights:
        meta = {"format": "pt", "lt2dsl_source": Path(args.dir).name}
        save_safetensors(imp.state, args.weights, metadata=meta)
        err.file.write(f"wrote {args.weights} ({len(imp.state)} tensors)\n")
    return 0


def _config_source(root: str) -> tuple[str, str]:
    try:
        ckpt = open_checkpoint(root)
    except Refused:
        return str(Path(root) / "config.json"), ""
    return ckpt.config_path, ckpt.config_text
