"""Writing a model folder: into a temporary sibling renamed into place only when complete
(:func:`fresh_directory`), its weights as safetensors files (:class:`ShardWriter`). Used by the demo models
(``core.models.create``) and the Qwen3-TTS checkpoint (``core.models.qwen3_tts.checkpoint_writer``); imports
neither torch nor vLLM (``safetensors.torch`` when a file is written)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator


@contextlib.contextmanager
def fresh_directory(directory: str, prefix: str) -> Iterator[str]:
    """Yield a new empty folder beside ``directory`` (named ``prefix`` + random, in its parent, which is
    created); when the block ends without an exception it replaces ``directory`` (any old one removed), else
    it is removed and the exception goes on -- so an interrupted write never leaves a half-written folder.
    The folder and everything in it get the modes a plain ``mkdir`` / ``open`` would give under the process's
    umask (a temporary folder is private, ``0o700``; the models are meant to be shared like any download).
    Raises ``OSError`` if the parent is not writable."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        yield tmp
        _as_if_made_plainly(tmp)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def current_umask() -> int:
    """The process's umask (``os.umask`` can only be read by setting it; it is set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _as_if_made_plainly(top: str) -> None:
    """Give ``top`` and everything under it the modes ``mkdir`` (``0o777``) / ``open`` (``0o666``) give under the
    umask."""
    mask = current_umask()
    os.chmod(top, 0o777 & ~mask)
    for root, dirs, files in os.walk(top):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~mask)


class ShardWriter:
    """Write (name, tensor) pairs to safetensors files of at most ``shard_bytes`` each, as they come.

    ``shard_bytes=None``: one file, ``<stem>.safetensors`` (all tensors held until :meth:`close`). Otherwise
    ``<stem>-0000N.safetensors`` plus ``<stem>.safetensors.index.json`` (``weight_map``), each shard written
    and freed when full, so peak host memory is about one shard. Tensors are written contiguous, sorted by
    name within a file (``safetensors.torch.save_file``)."""

    def __init__(self, directory: str, stem: str = "model", shard_bytes: int | None = None) -> None:
        self.directory, self.stem, self.shard_bytes = directory, stem, shard_bytes
        self.pending: dict[str, Any] = {}
        self.pending_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.files: list[str] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: Any) -> None:
        if name in self.pending or name in self.weight_map:
            raise ValueError(f"tensor {name!r} written twice")
        t = tensor.contiguous()
        self.pending[name] = t
        n = t.numel() * t.element_size()
        self.pending_bytes += n
        self.total_bytes += n
        if self.shard_bytes is not None and self.pending_bytes >= self.shard_bytes:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        fname = (f"{self.stem}.safetensors" if self.shard_bytes is None
                 else f"{self.stem}-{len(self.files) + 1:05d}.safetensors")
        save_file(dict(sorted(self.pending.items())), os.path.join(self.directory, fname))
        self.weight_map.update({k: fname for k in self.pending})
        self.files.append(fname)
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Write what is left (and the index when sharded); returns the file names written."""
        self._flush()
        if self.shard_bytes is not None:
            with open(os.path.join(self.directory, f"{self.stem}.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": self.total_bytes}, "weight_map": self.weight_map}, f, indent=1)
        return self.files
