"""Writing a model folder (``core.models.writing``), what the demo models and the Qwen3-TTS checkpoint share:
the folder appears only complete, the weights as one or several safetensors files."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from core.models.writing import ShardWriter, fresh_directory  # noqa: E402


def test_an_interrupted_write_leaves_the_old_folder_and_no_temporary(tmp_path):
    target = tmp_path / "models"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with fresh_directory(str(target), ".w-") as tmp:
            (tmp_path / "seen").write_text(tmp)
            open(os.path.join(tmp, "new.txt"), "w").write("new")
            raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["models", "seen"] and os.listdir(target) == ["old.txt"]
    with fresh_directory(str(target), ".w-") as tmp:
        open(os.path.join(tmp, "new.txt"), "w").write("new")
    assert sorted(os.listdir(tmp_path)) == ["models", "seen"] and os.listdir(target) == ["new.txt"]


def test_a_written_folder_has_the_modes_of_a_plain_mkdir_and_open(tmp_path):
    """The temporary sibling is private (``mkdtemp``: 0o700) and so are files made with ``mkstemp``; the folder
    renamed into place must be readable as the umask says, like any downloaded model."""
    import stat
    import tempfile

    old = os.umask(0o022)
    try:
        with fresh_directory(str(tmp_path / "models"), ".w-") as tmp:
            os.makedirs(os.path.join(tmp, "sub"))
            fd, _ = tempfile.mkstemp(dir=os.path.join(tmp, "sub"))
            os.close(fd)
            open(os.path.join(tmp, "config.json"), "w").write("{}")
    finally:
        os.umask(old)
    modes = {os.path.relpath(os.path.join(r, n), tmp_path): stat.S_IMODE(os.stat(os.path.join(r, n)).st_mode)
             for r, ds, fs in os.walk(tmp_path / "models") for n in ds + fs}
    assert stat.S_IMODE(os.stat(tmp_path / "models").st_mode) == 0o755
    assert modes and all(m == (0o755 if os.path.isdir(tmp_path / p) else 0o644) for p, m in modes.items()), modes


def test_one_file_or_shards_with_an_index_hold_every_tensor(tmp_path):
    tensors = {f"w{i}": torch.full((4, 4), float(i)).t() for i in range(5)}  # transposed: not contiguous
    one = ShardWriter(str(tmp_path), "one", None)
    shards = ShardWriter(str(tmp_path), "sharded", shard_bytes=2 * 64)
    for name, t in tensors.items():
        one.add(name, t)
        shards.add(name, t)
    assert one.close() == ["one.safetensors"]
    files = shards.close()
    assert files == [f"sharded-0000{i}.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / "sharded.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 64 and set(index["weight_map"]) == set(tensors)
    got = safetensors_torch.load_file(str(tmp_path / "one.safetensors"))
    for f in files:
        got_shard = safetensors_torch.load_file(str(tmp_path / f))
        assert all(index["weight_map"][k] == f for k in got_shard)
    assert all(torch.equal(got[k], t) for k, t in tensors.items())
    with pytest.raises(ValueError, match="written twice"):
        one.add("w0", tensors["w0"])
