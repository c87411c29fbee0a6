"""A fake driver module whose import raises OSError, like torch_npu without libhccl.so."""


def _load_vendor_library() -> None:
    raise OSError("libfakehccl.so: cannot open shared object file: No such file or directory")


_load_vendor_library()
