"""Build DeepSpeed's CPU Adam op into torch's extension cache (TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions), where the tests marked `cpu_adam` load it in a second. The README's test
command runs this once after the install; where it was not run, tests/conftest.py runs it in the
background while the other tests go on.

    python -m tests.build_ops
"""

from __future__ import annotations

import os


def build() -> None:
    os.environ.update(
        DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES=""
    )  # what the CPU tests load (helpers.cpu_env)
    from deepspeed.ops.op_builder import CPUAdamBuilder

    CPUAdamBuilder().load(verbose=False)
    print("cpu_adam ready", flush=True)


if __name__ == "__main__":
    build()
