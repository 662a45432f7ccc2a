"""What every part of the GPU check shares: its limits, its test selections, and the
Run, Step and Result records."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"  # the entry point (the env step runs it again)
TOTAL_LIMIT_S = 360  # what one run of the check may spend in its steps (on a GPU)
# the dry run's limits: each step's limit and per-test timeout times this, and only there
# (Run.limit_s, Run.test_timeout_s); a GPU run's are the steps' own. The emulated GPU is
# the CPU, every thread of a launch run one after another, here on two cores without
# pytest-xdist (a GPU machine has sixteen): the rest step's 1,606 emulated cuda tests took
# 36-40 s on an idle two-core machine against its 40 s GPU limit, and 70 s beside other
# work on the same cores. Three times the GPU's limit holds both, and still ends a hang
EMULATED_LIMIT_SCALE = 3
MAX_FILES = 8  # what comes back from the GPU machine: 8 files ...
FILE_CAP = 16 << 20  # ... of at most 16 MiB each
SECTION_CAP = 4 << 20  # one step's log in its file: the first HEAD_BYTES and the last rest
HEAD_BYTES = 512 << 10
TEST_TIMEOUT_ENV = "MINITORCH_GPU_TEST_TIMEOUT"  # read by tests/conftest.py
# the dry run's device: the emulated GPU (the CuPy stand-in on the CPU), set in each step's
# environment (minitorch_gpu/backend/_cupy.py reads it)
EMULATE_ENV = "MINITORCH_EMULATE_CUDA"
# a test hook, honoured only with --dry-run: "STEP=fail,STEP=timeout" replaces those steps'
# stand-ins with a command that fails, or one that hangs (with a child ignoring SIGINT) under
# a limit of INJECTED_TIMEOUT_S
INJECT_ENV = "MINITORCH_GPU_CHECK_INJECT"
INJECTED_TIMEOUT_S = 3

CORE_TEST_FILES = ["tests/test_kernels.py", "tests/test_amp.py", "tests/test_backend.py",
                   "tests/test_kernel_dispatch.py"]
# the dry run runs the cuda tests on the emulated GPU, where every thread of a launch runs
# one by one on the CPU: a kernel test takes ~0.1 s, but a launch past the 65,535-block grid
# limit ~50 s and a test training through the CLI a minute. Left out there (the GPU runs
# them): the tests step's five grid-limit cases; the rest step's training run of
# test_host_sync, and the emulator's own test files (the plain test suite runs them, and
# they train through the CLI); of test_ops.py's 3,281 cuda cases (~35 s emulated) the
# contiguous third (every op, forward and backward, every dtype), to fit the rest step's
# limit beside the other files
EMULATED_TESTS_DESELECTED = "not 4194340 and not past_65535_problems"
EMULATED_REST_DESELECTED = ("not test_a_training_run_reads_the_device_only and "
                            "(not test_ops.py or contiguous)")
EMULATED_REST_IGNORED = "tests/test_*emulat*.py"  # a glob: the emulator's test files
# racecheck is slow: kernels with shared-memory reductions and tiles, one case each
RACECHECK_SELECTION = ("flash_attention_kernel_on_gpt_head_views or "
                       "cross_entropy_kernel_matches_its_twin or "
                       "(layer_norm_kernel and both and shape0) or "
                       "(attention_softmax_kernel_matches_its_twin and bf16 and shape0)")
# memcheck slows a kernel down ~100x: one or a few cases per kernel (every .cu file, both
# probability types of the attention softmax, bf16 flash on head views, a cuBLAS call on
# them), the rest left to the tests step
MEMCHECK_SELECTION = ("(layer_norm_kernel and both and shape0) or (gelu_kernel and shape1) or "
                      "cross_entropy_kernel_matches_its_twin or adamw_kernel or "
                      "flash_attention_kernel_on_gpt_head_views or "
                      "(reads_gpt_heads_as_stored and bf16) or "
                      "(attention_softmax_kernel_matches_its_twin and shape0) or "
                      "(bf16_products_through_cublas and heads)")
# under compute-sanitizer, CuPy's memory pool is turned off first: memcheck only sees
# accesses outside whole allocations, and a pool makes one allocation of many arrays
POOL_OFF_PYTEST = ("import sys\n"
                   "try:\n"
                   "    import cupy\n"
                   "    cupy.cuda.set_allocator(None)\n"
                   "    cupy.cuda.set_pinned_memory_allocator(None)\n"
                   "    print('CuPy memory pools off', flush=True)\n"
                   "except ImportError as exc:\n"
                   "    print(f'no CuPy here ({exc})', flush=True)\n"
                   "import pytest\n"
                   "sys.exit(pytest.main(sys.argv[1:]))\n")
TOP_K = 50  # the topk step's sampling: the k likeliest tokens, as generate --top-k 50
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}
TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 64}


@dataclass
class Run:
    """What every step's command is built from."""

    dry: bool
    out: Path  # the files that come back
    work: Path  # caches, checkpoints and the full logs
    python: str = sys.executable
    xdist: bool = False  # pytest-xdist importable: tests run with -n auto
    sanitizer: Optional[str] = None  # compute-sanitizer's path
    inject: Dict[str, str] = field(default_factory=dict)

    @property
    def limit_scale(self) -> int:
        return EMULATED_LIMIT_SCALE if self.dry else 1

    def limit_s(self, step: "Step") -> int:
        """The step's time limit in this run: on a GPU its own, in the dry run scaled."""
        return step.limit_s * self.limit_scale

    def test_timeout_s(self, step: "Step") -> Optional[int]:
        """The step's per-test limit in this run (None: the step runs no tests)."""
        return None if step.test_timeout_s is None else step.test_timeout_s * self.limit_scale

    @property
    def device(self) -> str:
        """What "cuda" is in this run, for the plan and the summary."""
        return "the emulated GPU (MINITORCH_EMULATE_CUDA=1)" if self.dry else "the GPU"


Command = Union[List[str], str]  # a str: why the step is skipped


@dataclass
class Step:
    name: str
    limit_s: int
    file: str  # its log's file under $OUT (two steps may share one)
    what: str
    command: Callable[[Run], Command]
    figure: Callable[[str, Run], str]  # the key figure, from the step's whole log
    test_timeout_s: Optional[int] = None  # per-test limit for the pytest steps
    after: Optional[Callable[[Run, Path], None]] = None  # adds to the log when it has ended
    note: Optional[Callable[[Run], str]] = None  # a line for the head of its log
    # what the dry run cannot do on the emulated GPU (None: the step runs there for real)
    gpu_only: Optional[str] = None


@dataclass
class Result:
    step: Step
    status: str  # ok | FAILED rc N | TIMEOUT | skipped
    seconds: float
    limit_s: int
    figure: str
    log: Path

