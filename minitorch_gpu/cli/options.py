"""Options more than one command takes: a config with its overrides, the memory check."""
from __future__ import annotations

import argparse

__all__ = ["add_config_arguments", "add_memory_argument", "config_from_args"]


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """CONFIG, --set KEY=VALUE (repeatable) and --device."""
    p.add_argument("config", help="a YAML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-4 --set "
                        "model.n_layer=2 (the value is read as YAML; repeatable)")
    p.add_argument("--device", help="shorthand for --set system.device=DEVICE (cpu, cuda, "
                                    "cuda:N)")


def add_memory_argument(p: argparse.ArgumentParser) -> None:
    """--ignore-memory-check."""
    p.add_argument("--ignore-memory-check", action="store_true",
                   help="run even when the model's estimated memory is over what the device "
                        "has free (or system.memory_limit_gb, or "
                        "$MINITORCH_GPU_MEMORY_LIMIT_GB)")


def config_from_args(args: argparse.Namespace):
    """The config ``args`` name, with their --set, --device and --resume applied."""
    from ..train.config import load_config
    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"system.device={args.device}")
    if getattr(args, "resume", False):
        overrides.append("train.resume=true")
    return load_config(args.config, overrides)
