"""Chapter 10's shipped models: the weights and records both remaking commands share.

`pretrained` and `composition` train small models for far longer than a lecture may run, so
the course ships each as `course_lib/data/<stem>.pt` (a plain state dict) beside
`<stem>.json` (how it was made: the spec, the seed, the steps, the result). This module writes
and reads that pair and parses the commands' shared arguments (`NAME ...`, `--quick`, `--out`).
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Iterable
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent.parent / "data"
QUICK_STEPS = 3


def made_with() -> dict:
    """What a record says of the machine: the versions, one CPU thread."""
    return {"torch": torch.__version__, "python": platform.python_version(), "threads": 1,
            "device": "cpu"}


def save_record(record: dict, folder: Path, stem: str) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def save(model: torch.nn.Module, record: dict, folder: Path, stem: str) -> Path:
    """Write `<stem>.pt` (the state dict, contiguous) and `<stem>.json`; return the .pt path."""
    save_record(record, folder, stem)
    path = Path(folder) / f"{stem}.pt"
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def read_record(folder: Path, stem: str, command: str) -> dict:
    """The record `<stem>.json`, or FileNotFoundError naming the `command` that makes it."""
    path = Path(folder) / f"{stem}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: make it with `{command}`")
    return json.loads(path.read_text())


def load_weights(model: torch.nn.Module, folder: Path, stem: str) -> torch.nn.Module:
    """`model` with the weights of `<stem>.pt` (read with weights_only), in eval mode."""
    model.load_state_dict(torch.load(Path(folder) / f"{stem}.pt", weights_only=True))
    return model.eval()


def parser(module: str, doc: str, names: Iterable[str]) -> argparse.ArgumentParser:
    """The remaking command's arguments: model names (default all), --quick, --out."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"any of {', '.join(names)} (default: all)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps each (tests)")
    p.add_argument("--out", type=Path, default=DATA, help=f"folder (default {DATA})")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None,
          names: Iterable[str]) -> argparse.Namespace:
    """Parse argv; `names` left empty means every model; an unknown one is a usage error."""
    args = p.parse_args(argv)
    unknown = [name for name in args.names if name not in names]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(names)}")
    args.names = args.names or list(names)
    return args
