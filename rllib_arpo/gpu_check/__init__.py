"""``rllib check-gpu``: one command that says, piece by piece, whether a GPU machine runs this
project, in a few minutes on the tiny policy.

Pieces (``pieces.PIECES``), each one function that returns its measured figures, raises ``Skip`` when
the machine lacks what it needs (no CUDA device, one GPU where it needs two, a package missing)
or ``CheckFailed`` when the result is wrong; any other exception is a FAIL too:

1. ``cuda_torch``: CUDA torch, the device, bfloat16 support, a bf16 matmul against float32.
2. ``engine_generation``: the engine (vLLM, or with ``--engine hf`` the HF engine) on the device
   in bf16 continues prompts greedily as the HF engine in bf16 does (beside vLLM on the GPU; on
   the CPU for the HF engine on a GPU): tokens, and log-probs on the tokens both chose.
3. ``nccl_broadcast``: a sender process broadcasts perturbed weights over NCCL
   (``WeightBroadcastGroup``) into the engine (``open_weight_group`` / ``receive_weights``); the
   engine then continues greedily as a fresh engine loaded with those weights does.
4. ``lora_sync``: a LoRA adapter alone synced into the engine (vLLM loads it by version); the
   engine then continues greedily as the HF engine does on the merged model.
5. ``learner_update`` and ``deepspeed_update``: one update of one learner on the device in bf16
   (torch AdamW with float32 master weights; DeepSpeed ZeRO-2's bf16 optimizer) against the same
   update on the CPU in float64 (``learner_precision_tolerances``).
6. ``learners``: DDP and DeepSpeed ZeRO-2 / ZeRO-3 with 2 learners on 2 GPUs, in bf16, end two
   updates as one learner does (gradient norms, and the weights' updates).
7. ``learner_memory``: ``learner.memory``'s estimate against the peak CUDA memory
   (``torch.cuda.max_memory_allocated``) of one update.
8. ``throughput``: tokens/s of sampling (the engine) and of a training step (one learner).

Each check takes the ``Devices`` it runs on: ``GPU`` (cuda, NCCL, vLLM, bf16) is what the command
runs, ``GPU_HF`` the same with the HF engine (``--engine hf``: one GPU and no vLLM); ``CPU`` (cpu,
gloo, the HF engine, float32, learners on CPU cores; ``--device cpu``) runs the same comparisons on
a machine without a GPU, which is how the tests run them. Only the gate (``Devices.require``), the
bf16 support query and the peak CUDA memory are GPU-only.

Each piece runs in a thread of its own with a time limit, so an exception or a hang in one never
stops the others (a piece past its limit is reported FAIL and left running in the background; the
command exits when the others are done). Exit status: 1 if any piece FAILs, else 0.

The room's modules: ``outcomes.py`` (PASS / FAIL / SKIP and the two exceptions that say why),
``devices.py`` (``Devices``: where a piece runs, and the gate that skips it), ``runner.py`` (each
piece in a thread with a time limit, the lines, the summary and the JSON record), one module per
kind of piece (``cuda_torch.py``; ``engines.py``: engine_generation, lora_sync, nccl_broadcast;
``learners.py``: learner_update, deepspeed_update, learners, on the learner runs of
``learner_runs.py``; ``learner_memory.py``; ``throughput.py``) and ``pieces.py`` (``PIECES``, in
the order the command runs them).
"""
