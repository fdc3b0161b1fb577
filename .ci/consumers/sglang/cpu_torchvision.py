"""Run a module as __main__ after making torchvision importable next to CPU torch.

PyPI's torchvision for Linux x86_64 is a CUDA build: next to torch's CPU build its C extension
cannot load (it links libtorch_cuda), and torchvision's own Python then fails at import, because
it registers fake kernels for two operators (torchvision::nms, torchvision::qnms) that only the
extension defines. SGLang imports torchvision on its way to its Mooncake store module, though
nothing the store's test runs uses an image operator. This defines those two operators' schemas,
only when that very failure happens, and then runs the module given, unchanged:

    python cpu_torchvision.py sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store
"""

import runpy
import sys

import torch

SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        library.define(schema)
    import_torchvision.library = library  # kept alive: the definitions go with the object
    import torchvision  # noqa: F401,F811


if __name__ == "__main__":
    import_torchvision()
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
