"""The configs committed in `ds_configs/<name>/` (the plan arguments of each) and the host RAM
`ds-longctx plan` assumes per node when none is given."""

from __future__ import annotations

NODE_HOST_GB = {1: 128, 2: 256, 4: 512}  # host RAM of the H200 machines this project runs on
NODE_HOST_CAP_GB = 560  # the 8-GPU node
# host RAM given explicitly so that a change of the --host_mem_gb default never changes them
COMMITTED = {
    "qwen3-8b_1m_8x80gb": (
        "--model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560"
    ),
    "qwen3-8b_1m_8x141gb": (
        "--model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 141 --gpu h200 --host_mem_gb 560"
    ),
    "qwen3-8b_max_2x141gb": (
        "--model qwen3-8b --find_max_len --gpus 2 --gpu_mem_gb 141 --gpu h200 --host_mem_gb 256"
    ),
    "qwen3-8b_max_4x80gb": (
        "--model qwen3-8b --find_max_len --gpus 4 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 512"
    ),
    "qwen3-8b-dpo_1m_8x80gb": (
        "--model qwen3-8b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560 "
        "--objective dpo"
    ),
    "qwen3-8b_1m_2x8x80gb": (
        "--model qwen3-8b --seq_len 1048576 --nodes 2 --gpus 8 --gpu_mem_gb 80 --gpu h100 "
        "--host_mem_gb 560"
    ),
    "qwen3-8b_lora16_max_2x141gb": (
        "--model qwen3-8b --find_max_len --gpus 2 --gpu_mem_gb 141 --gpu h200 --host_mem_gb 256 "
        "--lora_rank 16"
    ),
    "qwen3-30b-a3b_1m_8x80gb": (
        "--model qwen3-30b-a3b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --gpu h100 "
        "--host_mem_gb 560"
    ),
    "qwen3-30b-a3b_1m_8x80gb_1024gb": (
        "--model qwen3-30b-a3b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --gpu h100 "
        "--host_mem_gb 1024"
    ),
    "qwen3-30b-a3b_1m_8x141gb": (
        "--model qwen3-30b-a3b --seq_len 1048576 --gpus 8 --gpu_mem_gb 141 --gpu h200 "
        "--host_mem_gb 560"
    ),
    "qwen3-30b-a3b_max_8x80gb": (
        "--model qwen3-30b-a3b --find_max_len --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560"
    ),
    "qwen3-30b-a3b_max_8x141gb": (
        "--model qwen3-30b-a3b --find_max_len --gpus 8 --gpu_mem_gb 141 --gpu h200 "
        "--host_mem_gb 560"
    ),
    # the 27B does not fit 1M on one 8-GPU node, so its longest length
    "qwen3.5-4b_1m_8x80gb": (
        "--model qwen3.5-4b --seq_len 1048576 --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560"
    ),
    "qwen3.5-4b_1m_8x141gb": (
        "--model qwen3.5-4b --seq_len 1048576 --gpus 8 --gpu_mem_gb 141 --gpu h200 "
        "--host_mem_gb 560"
    ),
    "qwen3.5-4b_max_8x80gb": (
        "--model qwen3.5-4b --find_max_len --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560"
    ),
    "qwen3.5-4b_max_8x141gb": (
        "--model qwen3.5-4b --find_max_len --gpus 8 --gpu_mem_gb 141 --gpu h200 --host_mem_gb 560"
    ),
    "qwen3.5-27b_max_8x80gb": (
        "--model qwen3.5-27b --find_max_len --gpus 8 --gpu_mem_gb 80 --gpu h100 --host_mem_gb 560"
    ),
    "qwen3.5-27b_max_8x141gb": (
        "--model qwen3.5-27b --find_max_len --gpus 8 --gpu_mem_gb 141 --gpu h200 --host_mem_gb 560"
    ),
}


def default_host_mem_gb(gpus: int) -> float:
    """128 GB per GPU up to the 8-GPU node's 560 GB."""
    return NODE_HOST_GB.get(gpus, min(128 * gpus, NODE_HOST_CAP_GB))
