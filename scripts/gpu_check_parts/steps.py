"""The steps, in order, most informative first."""
from __future__ import annotations

from .commands import (bench_command, decode_command, env_command, memcheck_command,
                       profile_command, racecheck_command, rest_command, stdlib_chars,
                       tests_command, topk_decode_command, train_command,
                       train_corpus)
from .definitions import TOP_K, Step
from .figures import (append_metrics, bench_figure, decode_figure, env_figure,
                      profile_figure, pytest_figure, sanitizer_figure, train_figure)

STEPS = [
    Step("env", 20, "env.txt", "nvidia-smi, CuPy's config, versions, the GPU as minitorch_gpu "
         "sees it", env_command, env_figure),
    Step("tests", 70, "tests.log", "kernel, amp, backend and kernel-dispatch tests on cuda",
         tests_command, pytest_figure, test_timeout_s=40),
    Step("bench", 45, "bench.log", "GPT-2 124M training step, bf16, batch 16 x 1024",
         bench_command, bench_figure),
    Step("decode", 15, "bench.log", "generation's tokens eager against the captured step's "
         "CUDA Graph (baby, small, GPT-2 124M)", decode_command, decode_figure),
    # its 10 s came from bench's 55 (3 + 10 steps and a matmul peak): the 360 s are full
    Step("topk", 10, "bench.log", f"decode with top_k={TOP_K} sampling captured as a CUDA "
         "Graph (GPT-2 124M)", topk_decode_command, decode_figure),
    Step("train", 33, "train.log", "shakespeare_char_gpu.yaml in bf16, 160 iterations",
         train_command("configs/shakespeare_char_gpu.yaml", 160, "checkpoints"), train_figure,
         after=append_metrics("checkpoints"),
         note=lambda run: f"corpus: {train_corpus(stdlib_chars(run))[1]}"),
    # its 12 s came from train's 45 (220 iterations then): fp16 with dynamic loss
    # scaling, the recipe of GPUs without bf16, on the tensor cores of this one
    Step("fp16", 12, "train.log", "shakespeare_char_gpu.yaml in fp16 with GradScaler, 60 "
         "iterations", train_command("configs/shakespeare_char_gpu.yaml", 60,
                                     "checkpoints_fp16", dtype="fp16"), train_figure,
         after=append_metrics("checkpoints_fp16")),
    Step("llama", 30, "train.log", "llama_small.yaml in bf16, 120 iterations (the Llama "
         "kernels and grouped-query attention in training)",
         train_command("configs/llama_small.yaml", 120, "checkpoints_llama"), train_figure,
         after=append_metrics("checkpoints_llama"),
         note=lambda run: f"corpus: {train_corpus(stdlib_chars(run))[1]}"),
    Step("profile", 20, "profile.txt", "profile --backward of the GPT-2 124M shape, batch 8",
         profile_command, profile_figure),
    Step("memcheck", 45, "sanitizer.log", "compute-sanitizer memcheck over the kernel tests",
         memcheck_command, sanitizer_figure, test_timeout_s=120,
         gpu_only="compute-sanitizer is NVIDIA's tool"),
    Step("rest", 40, "tests_rest.log", "the rest of the cuda op table (pytest -m cuda)",
         rest_command, pytest_figure, test_timeout_s=30),
    Step("racecheck", 20, "sanitizer.log", "compute-sanitizer racecheck over four kernel "
         "tests", racecheck_command, sanitizer_figure, test_timeout_s=120,
         gpu_only="compute-sanitizer is NVIDIA's tool"),
]

