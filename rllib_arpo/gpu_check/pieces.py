"""``PIECES``: every piece of ``rllib check-gpu`` by name, in the order the command runs them, each
with its time limit."""

from __future__ import annotations

from functools import partial

from rllib_arpo.gpu_check.cuda_torch import check_cuda_torch
from rllib_arpo.gpu_check.engines import check_engine_generation, check_lora_sync, check_nccl_broadcast
from rllib_arpo.gpu_check.learner_memory import check_learner_memory
from rllib_arpo.gpu_check.learners import check_learner_update, check_learners
from rllib_arpo.gpu_check.runner import Piece
from rllib_arpo.gpu_check.throughput import check_throughput

PIECES = {
    piece.name: piece
    for piece in (
        Piece("cuda_torch", check_cuda_torch, timeout_s=60),
        Piece("engine_generation", check_engine_generation, timeout_s=300),
        Piece("nccl_broadcast", check_nccl_broadcast, timeout_s=420),
        Piece("lora_sync", check_lora_sync, timeout_s=300),
        Piece("learner_update", check_learner_update, timeout_s=300, needs_ray=True),
        Piece("deepspeed_update", partial(check_learner_update, layout="zero2"), timeout_s=300, needs_ray=True),
        Piece("learners", check_learners, timeout_s=600, needs_ray=True),
        Piece("learner_memory", check_learner_memory, timeout_s=300, needs_ray=True),
        Piece("throughput", check_throughput, timeout_s=300, needs_ray=True),
    )
}
