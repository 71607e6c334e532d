"""What every command-line tool shares: how it refuses an argument, the ranges of its numbers,
and how it writes an output file.

- :class:`ToolParser`: argparse with a one-line error (``<tool>: error: argument --x: ...``,
  exit code 2, as argparse) for argparse's own refusals and the tool's (:meth:`ToolParser.error`);
- :func:`integer`, :func:`number`: argument types with a range, refused by argparse, by name;
- :func:`output_file`, :func:`output_folder`: an output path checked before any work (the
  suffix it must have, a folder that exists, never a file a previous run or the user wrote
  unless the tool's overwrite flag says so); :func:`save_npy` writes it whole or not at all.

A file whose contents cannot be used, or work that fails, is the tool's own error: exit code
1 and one line. No tool prints a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, NoReturn

import numpy as np


class ToolParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(ValueError):
    """An argument, or the path it names, that the tool cannot use (exit code 2)."""


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number{_range(low, high)}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a whole number{_range(low, high)}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (``low_open``: above low)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a finite number{_range(low, high, low_open)}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def _range(low, high, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    return f" <= {high:g}" if high is not None else ""


def _given(value: str | Path, flag: str) -> Path:
    if not str(value).strip():
        raise UsageError(f"argument {flag}: an empty path")
    return Path(value).expanduser()


def output_file(
    value: str | Path,
    flag: str,
    *,
    suffix: str = ".npy",
    overwrite: bool = False,
    overwrite_flag: str = "--overwrite",
    create_parent: bool = False,
) -> Path:
    """The file ``flag`` names, checked before any work: it ends in ``suffix`` (the path the
    tool prints is the one it writes), is not a folder, is in a folder that exists (or one
    the tool makes: ``create_parent``), and is not there yet unless ``overwrite``."""
    path = _given(value, flag)
    if path.suffix != suffix:
        raise UsageError(f"argument {flag}: {str(value)!r} must end in {suffix}")
    if path.is_dir():
        raise UsageError(f"argument {flag}: {path} is a folder; give a file path ending in {suffix}")
    parent = path.parent
    if not create_parent and not parent.is_dir():
        raise UsageError(f"argument {flag}: the folder {parent} does not exist (create it first)")
    if create_parent and parent.exists() and not parent.is_dir():
        raise UsageError(f"argument {flag}: {parent} is a file, not a folder")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise UsageError(f"argument {flag}: {path} exists: pass {overwrite_flag} to replace it, or give another file")
    return path


def outside(path: Path, folder: str | Path, flag: str) -> Path:
    """``path``, unless it is inside ``folder`` (a run's output folder: it holds what that run
    wrote, and a later run or tool takes everything in it for the run's)."""
    if Path(folder).resolve() in Path(path).resolve().parents:
        raise UsageError(
            f"argument {flag}: {path} is inside the run folder {folder}, which holds only what the run "
            "wrote: give a path outside it"
        )
    return path


def output_folder(
    value: str | Path,
    flag: str,
    *,
    writes: tuple[str, ...] = (),
    overwrite: bool = False,
    overwrite_flag: str = "--overwrite",
    empty: bool = False,
) -> Path:
    """The folder ``flag`` names, checked before any work: not a file; none of the files the
    tool ``writes`` there already in it unless ``overwrite`` (``empty``: nothing at all in it)."""
    folder = _given(value, flag)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"argument {flag}: {folder} is a file, not a folder")
    if folder.is_dir():
        if empty and any(folder.iterdir()):
            raise UsageError(f"argument {flag}: {folder} is not empty; give a new folder")
        taken = [name for name in writes if (folder / name).exists()]
        if taken and not overwrite:
            raise UsageError(
                f"argument {flag}: {folder} already holds {', '.join(taken)}: pass {overwrite_flag} "
                "to replace them, or give another folder"
            )
    return folder


def save_npy(path: Path, array: np.ndarray, overwrite: bool = False) -> None:
    """``np.save`` to exactly ``path``, whole or not at all. Without ``overwrite`` the file is
    created exclusively (one that appeared there meanwhile is kept: ``FileExistsError``); with
    it, written beside the old one and moved into its place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite:
        with open(path, "xb") as sink:  # FileExistsError: never replaced
            try:
                np.save(sink, array, allow_pickle=False)
            except BaseException:
                path.unlink()  # the file this call created, half written
                raise
        return
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as sink:
            np.save(sink, array, allow_pickle=False)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def refuse(prog: str, exc: BaseException | str, code: int = 1) -> int:
    """Print ``<prog>: error: <exc>`` on one line; return ``code`` (2 for a :class:`UsageError`)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{prog}: error: {text}", file=sys.stderr)
    return 2 if isinstance(exc, UsageError) else code
